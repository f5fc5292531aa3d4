"""The tests' view of a refused command line (`python -m gpuengine COMMAND`, or the gate's `./gate COMMAND`):
argparse's usage error, status 2, no traceback."""
from __future__ import annotations

import pytest

from gpuengine.__main__ import MOVED, main as engine_main
from gpuengine.gate.commands import main as gate_main


def refused(capsys, command: str, *argv: str) -> str:
    """Run `command argv` expecting a usage error; returns its message without the `...: error: ` prefix."""
    main, prog = (gate_main, "./gate") if command in MOVED else (engine_main, "python -m gpuengine")
    with pytest.raises(SystemExit) as stopped:
        main([command, *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} {command}") and "Traceback" not in err
    return err.splitlines()[-1].removeprefix(f"{prog} {command}: error: ")
