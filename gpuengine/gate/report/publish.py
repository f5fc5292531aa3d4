"""Publishing a finished report folder in the place of the previous one, whole, in one step.

The report is drawn into a scratch folder beside `<out>` (same file system,
so a rename moves it); `swap_in` then exchanges the two folders with one
`renameat2(RENAME_EXCHANGE)` where Linux and the file system have it: a
reader finds the old report or the new one, never neither. Elsewhere the old
folder is renamed aside and the new one renamed in, the old one put back if
that fails. Either way the old report is deleted only once the new one is in
place, and a copy that cannot be deleted is said, not hidden.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .store import ReportError

INDEX = "index.html"
FIGURES = "figures"
AT_FDCWD = -100         # <fcntl.h>: paths relative to the working folder
RENAME_EXCHANGE = 2     # <linux/fs.h>: swap the two names atomically
UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}   # old kernel or a file system without it


def check_replaceable(out: Path) -> None:
    """ReportError unless `out` is missing, empty, or holds only a report (index.html, figures/): the
    build replaces the whole folder, so `--out` pointed at anything else must not cost its files."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ReportError(f"{out}: not a folder; the report needs a folder of its own (--out)")
    foreign = sorted(p.name for p in out.iterdir() if p.name not in (INDEX, FIGURES))
    if foreign:
        raise ReportError(f"{out}: holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''} besides a "
                          f"report; the report replaces the whole folder, so give it a folder of its own (--out)")


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders `a` and `b` in one step; False where this system cannot (nothing was changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2   # glibc 2.28 and later
    except (OSError, AttributeError):
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(b))


def _rename_aside(scratch: Path, out: Path) -> Path:
    """The two-rename swap: `out` aside to a reserved name, `scratch` into its place, `out` back on failure.
    Returns where the old report now is."""
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-old-"))
    try:
        os.replace(out, old)   # onto the empty folder mkdtemp reserved
    except OSError:
        old.rmdir()
        raise
    try:
        os.replace(scratch, out)
    except OSError as exc:
        try:
            os.replace(old, out)
        except OSError as undo:   # the one case that leaves no report at `out`: say where it is
            raise OSError(exc.errno, f"{exc.strerror}; the previous report could not be put back and is "
                                     f"at {old} ({undo})", str(out)) from exc
        raise
    return old


def swap_in(scratch: Path, out: Path) -> str | None:
    """Put the finished `scratch` folder in the place of `out`, whole, and delete the old report.

    Raises OSError with `out` as it was when the swap itself fails; returns a notice when the old report,
    already replaced, could not be deleted (a read-only folder in it, say)."""
    os.chmod(scratch, _umask_mode())   # mkdtemp made it private; the report is an ordinary folder
    if not out.exists():
        os.replace(scratch, out)
        return None
    old = scratch if _exchange(scratch, out) else _rename_aside(scratch, out)
    try:
        shutil.rmtree(old)
    except OSError as exc:   # the new report is in place; only a copy of the old one is left to say
        return f"{old}: the previous report, replaced but not deleted ({exc}); delete it by hand"
    return None
