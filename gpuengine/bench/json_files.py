"""Reading and writing the suite's JSON files (thresholds, noise, stored runs) with errors that name the place.

A broken file is one error naming the file and the position (line, column)
or the field, never a bare `JSONDecodeError` traceback; a file is written
whole to a temporary name and then renamed, so a crash never leaves half a
file behind.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


class JsonFileError(ValueError):
    """A JSON file of the suite is missing, unreadable or malformed; the message names the file and place."""


def load_json(path: Path | str, name: str | None = None):
    """The parsed content of `path`, or JsonFileError naming the file (as `name` where given) and the line/column
    of the fault."""
    path = Path(path)
    name = name or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JsonFileError(f"{name}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JsonFileError(f"{name}: cannot be read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonFileError(f"{name}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def write_text(path: Path | str, text: str, new: bool = False) -> Path:
    """Write `text` to `path` atomically: a temporary file beside it, then a rename (nothing is left behind
    when the write fails); parent folders are created. `new`: FileExistsError where `path` exists, even if
    another process made it a moment ago (a hard link in place of the rename), so nothing is overwritten."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(scratch, 0o644)
        if new:
            os.link(scratch, path)
        else:
            os.replace(scratch, path)
    finally:
        Path(scratch).unlink(missing_ok=True)
    return path


def write_json(path: Path | str, content) -> Path:
    """Write `content` to `path` as JSON, atomically (write_text)."""
    return write_text(path, json.dumps(content, indent=1) + "\n")


def require_number(value, where: str, minimum: float | None = None, allow_none: bool = False):
    """`value` as a float, or JsonFileError saying which field is wrong and what it holds."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise JsonFileError(f"{where} must be a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise JsonFileError(f"{where} must be >= {minimum}, got {value!r}")
    return float(value)
