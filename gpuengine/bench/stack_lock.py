"""The locked stack a run measures: which tier's lock applies here, its identity, and how this Python differs.

`./gate` installs each tier's stack from `locks/<tier>.txt` (made by `./gate
lock` with uv; docs/gate.md, "The locked stack"). A stored run and the kept
cuDNN plans name the lock they ran on (`machine_info["stack_lock"]`,
`record`), and stored-run mode compares a test only with runs of the same
stack (`stack_of`): a new cuDNN frontend re-autotuned every plan and made
unchanged tests look slower, so a run on another stack is no baseline.

A lock is a pip requirements file of exact pins (`name==version`, uv's
annotations as comments). Its identity is the sha256 of its pins alone,
sorted, so a header or comment edit is not a stack change. An installed
version matches a pin as pip's `==` does: a local label the pin lacks
(`2.11.0+cu130` for `2.11.0`) is no difference, one the pin names (`+cpu`) must
be there. A missing lock file is recorded as such, never an error: a run
outside `./gate` or on a checkout without locks still runs.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "locks"
TIERS = ("cpu", "cuda13", "cuda12")
TIER_ENV = "GATE_LOCK_TIER"   # the tier ./gate installed (or checked): it wins over what this Python looks like
CUPY_TIERS = {"cupy-cuda13x": "cuda13", "cupy-cuda12x": "cuda12"}
SHA_DIGITS = 12


class LockError(ValueError):
    """A lock file or a list of installed packages that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Lock:
    tier: str
    path: Path
    pins: dict[str, str]   # canonical name -> the pinned version, as the lock spells it

    @property
    def sha256(self) -> str:
        """The first hex digits of the sha256 of the pins, one `name==version` a line, sorted."""
        text = "".join(f"{name}=={version}\n" for name, version in sorted(self.pins.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:SHA_DIGITS]


@dataclass(frozen=True)
class Difference:
    name: str
    locked: str
    installed: str | None   # None: not installed

    def describe(self) -> str:
        return f"{self.name} {self.locked} -> {self.installed or 'not installed'}"


@dataclass(frozen=True)
class StackId:
    """What makes stored runs comparable: the lock (tier and pins) and how the run's Python differed from it."""

    tier: str | None = None   # None: the run named no lock (stored before locks existed)
    sha256: str | None = None   # None with a tier: the tier's lock file was missing
    differs: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.tier is None:
            return "no lock"
        text = f"{self.tier} lock {self.sha256}" if self.sha256 else f"{self.tier} (no lock file)"
        if self.differs:
            more = len(self.differs) - 3
            text += " with " + ", ".join(self.differs[:3]) + (f" and {more} more" if more > 0 else "")
        return text


NO_LOCK = StackId()


def _pin_lines(path: Path, text: str):
    """(line number, requirement text) of every pin: comments, blank lines and pip options skipped."""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            yield number, line


def parse_pins(path: Path | str, text: str) -> dict[str, str]:
    """Canonical name -> exact version of every `name==version` line, or LockError naming the line that is not one."""
    pins: dict[str, str] = {}
    for number, line in _pin_lines(Path(path), text):
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise LockError(f"{path}:{number}: not a requirement ({exc}): {line!r}") from None
        specs = list(requirement.specifier)
        if requirement.url or len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise LockError(f"{path}:{number}: a lock pins exact versions (name==version), not {line!r}")
        name = canonicalize_name(requirement.name)
        if name in pins:
            raise LockError(f"{path}:{number}: {name} is pinned twice")
        pins[name] = specs[0].version
    return pins


def read_lock(path: Path | str, tier: str) -> Lock:
    """The lock at `path`; LockError where it is missing, unreadable or not exact pins."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockError(f"{path}: no such file (./gate lock {tier} writes it)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: cannot be read ({exc})") from None
    return Lock(tier, path, parse_pins(path, text))


def lock_path(tier: str, locks: Path = LOCKS) -> Path:
    if tier not in TIERS:
        raise LockError(f"no tier {tier!r} (tiers: {', '.join(TIERS)})")
    return locks / f"{tier}.txt"


def installed_versions() -> dict[str, str]:
    """Canonical name -> version of every distribution this Python imports, the first on sys.path winning (as
    an import would: PYTHONPATH's wheels before the image's)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def applicable_tier(installed: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> str:
    """The tier whose lock applies: the one ./gate chose (GATE_LOCK_TIER), else the CUDA major of the CuPy this
    Python has, else cpu."""
    named = environ.get(TIER_ENV, "").strip()
    if named:
        if named not in TIERS:
            raise LockError(f"{TIER_ENV}={named!r} is no tier (tiers: {', '.join(TIERS)})")
        return named
    return next((tier for cupy, tier in CUPY_TIERS.items() if cupy in installed), "cpu")


def differences(lock: Lock, installed: Mapping[str, str | None]) -> list[Difference]:
    """Each pin this Python does not meet as pip's `==` would, by name; `installed` maps canonical names to
    versions (None: present, version unknown)."""
    found = []
    for name, locked in sorted(lock.pins.items()):
        if name not in installed:
            found.append(Difference(name, locked, None))
        elif not _meets(locked, installed[name]):
            found.append(Difference(name, locked, installed[name] or "unknown version"))
    return found


def _meets(locked: str, version: str | None) -> bool:
    if version is None:
        return False
    try:
        return SpecifierSet(f"=={locked}").contains(version, prereleases=True)
    except InvalidVersion:   # a legacy version string: no pin of a lock spells one
        return False


def record_for(tier: str, installed: Mapping[str, str], locks: Path = LOCKS) -> dict:
    """machine_info's stack_lock: the tier, its lock file, the lock's identity and how `installed` differs from it."""
    path = lock_path(tier, locks)
    shown = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    try:
        lock = read_lock(path, tier)
    except LockError as exc:
        return {"tier": tier, "file": shown, "sha256": None, "matches": False, "differs": [], "problem": str(exc)}
    differs = [d.describe() for d in differences(lock, installed)]
    return {"tier": tier, "file": shown, "sha256": lock.sha256, "matches": not differs, "differs": differs}


@lru_cache(maxsize=1)
def current_record() -> dict:
    """This Python's stack_lock record (computed once a process: the installed packages do not change)."""
    installed = installed_versions()
    try:
        tier = applicable_tier(installed)
    except LockError as exc:
        return {"tier": None, "file": None, "sha256": None, "matches": False, "differs": [], "problem": str(exc)}
    return record_for(tier, installed)


def stack_of(machine_info: Mapping) -> StackId:
    """The stack a stored run (its machine_info) or this run ran on; NO_LOCK for runs stored before locks."""
    record = machine_info.get("stack_lock") if isinstance(machine_info, Mapping) else None
    if not isinstance(record, Mapping) or not record.get("tier"):
        return NO_LOCK
    differs = record.get("differs")
    return StackId(str(record["tier"]), record.get("sha256") or None,
                   tuple(sorted(map(str, differs))) if isinstance(differs, list) else ())


def lock_identity(record: Mapping) -> str:
    """The lock alone, readably ('cuda13 lock 1a2b3c4d5e6f', 'no lock'): what the kept cuDNN plans are tied to
    beside the live cuDNN versions."""
    stack = stack_of({"stack_lock": record})
    return str(StackId(stack.tier, stack.sha256))
