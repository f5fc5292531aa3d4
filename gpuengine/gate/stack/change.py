"""What `./gate perf --against-stack LOCK` compares: the other stack's lock, how the head's differs, and its name.

A stack A/B runs the working tree's engine on both sides, the base in the
environment of another lock (gpuengine/gate/stack/env.py builds it), the head
in the environment the gate runs in, whose lock is the tier's
`locks/<tier>.txt`. LOCK names the base's lock:

    build/old-cuda13.txt            a file
    HEAD~3:locks/cuda13.txt         a lock as committed at a revision (read with `git show REV:PATH`)

A file is read as a path first, so a path holding a colon still works. The
lock must be of the head's tier: where its header names another tier, that is
one error (a CPU lock cannot judge a GPU stack). The change between the two
locks (`StackChange`) is what the session prints at its start and keeps in
every test's extra_info["ab"]["stack_change"]; versions compare as
stack_lock's `differences` does (pip's `==`: a local label such as +cu130 the
base's pin lacks is no change). Where the two locks name different cuDNN or
cuDNN frontend versions the sides must not share cuDNN plans
(`shares_plans`): a plan chosen by one cuDNN's timings says nothing about the
other's, and a plan name the other does not build would be autotuned anyway.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuengine.bench.stack_lock import Lock, LockError, differences, parse_pins

# The packages whose versions decide which cuDNN plans exist and how fast each is.
CUDNN_FRONTEND = "nvidia-cudnn-frontend"
CUDNN_LIBRARY_PREFIX = "nvidia-cudnn-cu"   # nvidia-cudnn-cu13, nvidia-cudnn-cu12
HEADER_TIER = re.compile(r"^# The (\S+) tier's locked stack", re.MULTILINE)   # `./gate lock`'s first line
SHOWN_CHANGES = 3   # changes a label names before "and N more"


@dataclass(frozen=True)
class OtherLock:
    """The base's lock as the user named it, its pins and its text (what pip installs from)."""

    spec: str     # a path, or REV:PATH
    lock: Lock
    text: str

    @property
    def sha256(self) -> str:
        return self.lock.sha256


def _git_show(root: Path, rev: str, path: str, option: str) -> str:
    try:
        result = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True, text=True)
    except OSError as exc:
        raise LockError(f"{option} {rev}:{path}: git cannot run here ({exc})") from None
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise LockError(f"{option} {rev}:{path}: not a lock committed at {rev} "
                        f"({said[-1] if said else f'git show exited {result.returncode}'})")
    return result.stdout


def read_other_lock(spec: str, tier: str, root: Path, option: str = "--against-stack") -> OtherLock:
    """The lock `spec` names (a file, else REV:PATH in the git history at `root`), checked to be `tier`'s;
    LockError naming `option`, `spec` and the cause otherwise."""
    spec = spec.strip()
    if not spec:
        raise LockError(f"{option} needs a lock: a file (build/old-cuda13.txt) or REV:PATH "
                        "(HEAD~3:locks/cuda13.txt)")
    file = Path(spec) if Path(spec).is_absolute() else Path(root) / spec
    if file.is_file():
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise LockError(f"{option} {spec}: cannot be read ({exc})") from None
    elif ":" in spec:
        rev, path = spec.split(":", 1)
        if not rev or not path:
            raise LockError(f"{option} {spec}: REV:PATH needs both, e.g. HEAD~3:locks/{tier}.txt")
        text = _git_show(root, rev, path, option)
    else:
        raise LockError(f"{option} {spec}: no such file (a lock file, or REV:PATH such as "
                        f"HEAD~3:locks/{tier}.txt)")
    named = HEADER_TIER.search(text)
    if named and named.group(1) != tier:
        raise LockError(f"{option} {spec}: the {named.group(1)} tier's lock, where the {tier} tier's is wanted "
                        "(a stack A/B compares two locks of this machine's tier)")
    pins = parse_pins(spec, text)
    if not pins:
        raise LockError(f"{option} {spec}: pins no package (a lock is `name==version` lines)")
    return OtherLock(spec, Lock(tier, Path(spec), pins), text)


@dataclass(frozen=True)
class StackChange:
    """The head's lock against the base's: packages whose version changed, the head's alone, the base's alone."""

    changed: tuple[tuple[str, str, str], ...] = ()   # (name, base version, head version)
    added: tuple[tuple[str, str], ...] = ()          # (name, head version): pinned by the head's lock only
    removed: tuple[tuple[str, str], ...] = ()        # (name, base version): pinned by the base's lock only

    @property
    def empty(self) -> bool:
        return not (self.changed or self.added or self.removed)

    def items(self) -> list[str]:
        """One phrase per package, in the order changed, added, removed."""
        return ([f"{name} {base} -> {head}" for name, base, head in self.changed]
                + [f"{name} {version} added" for name, version in self.added]
                + [f"{name} {version} removed" for name, version in self.removed])

    def summary(self) -> str:
        """'a 1 -> 2, b 3 added and 4 more', or 'the same pins'."""
        items = self.items()
        if not items:
            return "the same pins"
        more = len(items) - SHOWN_CHANGES
        return ", ".join(items[:SHOWN_CHANGES]) + (f" and {more} more" if more > 0 else "")

    def lines(self) -> list[str]:
        """What the session prints once at its start: a count, then each package on a line of its own."""
        if self.empty:
            return ["the two locks pin the same packages at the same versions"]
        head = (f"{len(self.changed)} changed, {len(self.added)} added, {len(self.removed)} removed "
                "(base -> head)")
        return [head] + [f"  {item}" for item in self.items()]

    def as_dict(self) -> dict:
        return {"changed": [{"name": n, "base": b, "head": h} for n, b, h in self.changed],
                "added": [{"name": n, "head": v} for n, v in self.added],
                "removed": [{"name": n, "base": v} for n, v in self.removed]}

    def names(self) -> set[str]:
        return ({name for name, _, _ in self.changed} | {name for name, _ in self.added}
                | {name for name, _ in self.removed})


def stack_change(base: Lock, head: Lock) -> StackChange:
    """How `head` differs from `base`, by stack_lock's comparison: a base pin the head's pins do not meet as
    pip's `==` would is changed (or removed where the head lacks it); a head pin the base lacks is added."""
    changed, removed = [], []
    for difference in differences(base, head.pins):
        if difference.installed is None:
            removed.append((difference.name, difference.locked))
        else:
            changed.append((difference.name, difference.locked, difference.installed))
    added = [(name, version) for name, version in sorted(head.pins.items()) if name not in base.pins]
    return StackChange(tuple(changed), tuple(added), tuple(removed))


def cudnn_packages(change: StackChange) -> list[str]:
    """The changed packages that decide cuDNN's plans: the frontend and the cuDNN library."""
    return sorted(name for name in change.names()
                  if name == CUDNN_FRONTEND or name.startswith(CUDNN_LIBRARY_PREFIX))


def shares_plans(change: StackChange) -> bool:
    """Whether the base's plan choices may be handed to the head: only where both run the same cuDNN."""
    return not cudnn_packages(change)


def base_label(other: OtherLock, change: StackChange) -> str:
    """The base as the header, the failure lines and extra_info["ab"]["base"] name it:
    'stack cuda13 lock 3f1a2b3c4d5e (nvidia-cudnn-frontend 1.22.1 -> 1.32.0 on the head)'."""
    if change.empty:
        return f"stack {other.lock.tier} lock {other.sha256} (the same pins as the head's)"
    return f"stack {other.lock.tier} lock {other.sha256} ({change.summary()} on the head)"
