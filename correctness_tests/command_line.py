"""The tests' view of a refused `python -m gpuengine COMMAND` line: argparse's usage error, status 2, no traceback."""
from __future__ import annotations

import pytest

from gpuengine.__main__ import main as cli_main


def refused(capsys, command: str, *argv: str) -> str:
    """Run `command argv` expecting a usage error; returns its message without the `...: error: ` prefix."""
    with pytest.raises(SystemExit) as stopped:
        cli_main([command, *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: python -m gpuengine {command}") and "Traceback" not in err
    return err.splitlines()[-1].removeprefix(f"python -m gpuengine {command}: error: ")
