"""The command lines' argument checks, run before any work starts.

Each check is an argparse `type` (one argument alone) or raises `UsageError`
(arguments that cannot run together, or a setting of the machine): either way
the command stops with argparse's usage error, status 2, naming the argument,
the value given and what is allowed. A search that runs for an hour must not
learn at its end that it cannot write its result, so output places are
checked here too (`output_file`, `output_folder`): their folder must exist, or
be creatable, and be writable.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..config import ConfigError, EngineConfig


class UsageError(ValueError):
    """The arguments of a command cannot run; the message names the argument, its value and what is allowed."""


def checked(option: str, parse, text: str):
    """`parse(text)` for a check that needs other arguments first; its refusal as a UsageError naming `option`."""
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"argument {option}: {exc}") from None


def _bounds_text(kind: str, low, high, low_open: bool = False, high_open: bool = False) -> str:
    if high is None:
        return f"{kind} {'>' if low_open else '>='} {low:g}"
    if low_open or high_open:
        return f"{kind} {'>' if low_open else '>='} {low:g} and {'<' if high_open else '<='} {high:g}"
    return f"{kind} from {low:g} to {high:g}"


def whole(low: int, high: int | None = None):
    """argparse type: a whole number from `low` to `high` (None: no upper end)."""
    allowed = _bounds_text("a whole number", low, high)

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} is not accepted; use {allowed}")
        return value
    return parse


def number(low: float, high: float | None = None, low_open: bool = False, high_open: bool = False):
    """argparse type: a finite number between `low` and `high`, either end open or closed."""
    allowed = _bounds_text("a number", low, high, low_open, high_open)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        inside = (math.isfinite(value) and (value > low if low_open else value >= low)
                  and (high is None or (value < high if high_open else value <= high)))
        if not inside:   # NaN and inf fall out here too: no timeout or budget is infinite by typo
            raise argparse.ArgumentTypeError(f"{text!r} is not accepted; use {allowed}")
        return value
    return parse


def _unwritable(folder: Path) -> str | None:
    """Why files cannot be created in `folder` (or in the folders that would be made for it); None if they can."""
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def output_file(text: str) -> Path:
    """argparse type: a file to write at the end; its folder exists and is writable, and it is not a folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give the path of a file")
    folder = path.parent
    why = f"its folder {folder} does not exist" if not folder.exists() else _unwritable(folder)
    if why:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {why}")
    return path


def _folder(text: str, check: Path) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder")
    why = _unwritable(check)
    if why:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {why}")
    return path


def output_folder(text: str) -> Path:
    """argparse type: a folder whose files are written at the end; it exists, or can be made, and is writable."""
    return _folder(text, Path(text))


def replaced_folder(text: str) -> Path:
    """argparse type: a folder replaced whole at the end: the new one is made beside it and renamed into
    its place, so its parent must be writable (or creatable)."""
    return _folder(text, Path(text).parent)


def workload_arguments(parser: argparse.ArgumentParser, defaults: tuple[str, ...], precisions) -> None:
    """The workloads (as `profile` takes them) and the precisions a GPU study runs; `gpu_workloads` checks them."""
    from gpuengine.config import PRECISIONS
    parser.add_argument("workloads", nargs="*", default=list(defaults),
                        help=f"workloads as `profile` takes them (default: {' '.join(defaults)})")
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(precisions))


def workload_entry(name: str, length: int | None = None, option: str = "workloads"):
    """The workload `name` as `profile` takes it, at sequence length `length` where given; else a UsageError naming
    the argument at fault: `option` for a name no workload has, --length for a length the workload cannot take."""
    from .profile.workloads import get_workload
    try:
        entry = get_workload(name)
    except ValueError as exc:
        raise UsageError(f"argument {option}: {exc}") from None
    if length is None:
        return entry
    try:
        return get_workload(name, length)
    except ValueError as exc:
        raise UsageError(f"argument --length: {exc}") from None


def gpu_workloads(names: list[str], why_gpu: str, length: int | None = None) -> None:
    """Each name a workload as `profile` takes it (at sequence length `length` where given), on a machine with a
    visible GPU; else a UsageError naming the first bad name or length, or saying `why_gpu` (what the CPU tier
    cannot do)."""
    from ..runtime.backend import gpu_visible
    for name in names:
        workload_entry(name, length)
    if not gpu_visible():
        raise UsageError(f"no CUDA GPU is visible here (CuPy missing, or no device): {why_gpu}")


def run_command(parser: argparse.ArgumentParser, argv: list[str], engine_commands: tuple[str, ...]) -> int:
    """Parse `argv` and run its command; before any work a bad argument, or a bad GPUENGINE_* toggle where the
    command runs the engine, is refused once (the usage and the message, status 2), not by every trial or
    session it would reach."""
    from gpuengine.config import ConfigError, EngineConfig
    args = parser.parse_args(argv)
    try:
        if args.command in engine_commands:
            EngineConfig.from_env()
        if getattr(args, "check", None):
            args.check(args)
    except (UsageError, ConfigError) as exc:
        args.parser.error(str(exc))   # exits 2
    return args.run(args)


def parse_toggle(text: str, option: str = "toggle") -> tuple[str, object]:
    """'deterministic=0' -> ('deterministic', False), checked as EngineConfig checks it. The settings a command
    sets per case itself (precision, CUDA graphs, device, resident data) are refused."""
    name, equals, raw = text.partition("=")
    if not equals or not name:
        raise UsageError(f"argument {option}: {text!r} is not TOGGLE=VALUE (e.g. deterministic=0)")
    if name in ("precision", "cuda_graph", "device", "resident_data"):
        raise UsageError(f"argument {option}: {name} is set per case here (--precision, --cuda-graph); "
                         "give another toggle")
    try:
        return name, getattr(EngineConfig.from_env({}, **{name: raw}), name)
    except ConfigError as exc:
        raise UsageError(f"argument {option}: {exc}") from None
