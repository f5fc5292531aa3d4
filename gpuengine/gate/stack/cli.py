"""`./gate`'s lock checks: this Python against a tier's lock, and the wheels a machine without a registry lacks.

    python -m gpuengine.gate.stack.cli check --lock locks/cuda13.txt --tier cuda13
        each package of the lock this Python lacks or has at another version (./gate runs it once where
        GATE_NO_INSTALL=1 keeps it from installing); always exits 0: the run goes on and records the differences
    python -m gpuengine.gate.stack.cli wheels DIR --have FREEZE --lock locks/cuda13.txt --tier cuda13
                                            --python-version 3.12 [--list]
        the lock's packages that FREEZE (`pip freeze`, or `pip list --format=json`, of the machine to bring them to)
        lacks or has at another version, then `pip download` of exactly those, for CPython of that version on
        manylinux x86_64, into DIR (--list: only the list); --lock may be REV:PATH, a lock as committed at REV

./gate passes the tier's lock and Python (`./gate wheels DIR --have FREEZE [--tier T] [--lock LOCK]`).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from .change import read_other_lock
from gpuengine.bench.stack_lock import TIERS, Difference, Lock, LockError, differences, installed_versions, read_lock

# The manylinux x86_64 wheels a glibc 2.28 or newer machine takes (the GPU image has 2.39), newest tag first.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def read_have(path: Path | str) -> dict[str, str | None]:
    """Canonical name -> version of a `pip freeze` file or a `pip list --format=json` one (None: installed
    from a URL, version unknown); LockError naming the line that is neither."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: cannot be read ({exc})") from None
    if text.lstrip().startswith("["):
        try:
            return {canonicalize_name(entry["name"]): str(entry["version"]) for entry in json.loads(text)}
        except (json.JSONDecodeError, TypeError, KeyError) as exc:
            raise LockError(f"{path}: not a `pip list --format=json` list of name and version ({exc})") from None
    have: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "-")):   # comments; -e checkouts and pip options name no wheel
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise LockError(f"{path}:{number}: not a `pip freeze` line ({exc}): {line!r}") from None
        specs = list(requirement.specifier)
        if requirement.url:
            have[canonicalize_name(requirement.name)] = None
        elif len(specs) == 1 and specs[0].operator in ("==", "==="):
            have[canonicalize_name(requirement.name)] = specs[0].version
        else:
            raise LockError(f"{path}:{number}: `pip freeze` names an exact version, not {line!r}")
    return have


def download_command(missing: list[Difference], dest: Path | str, python_version: str) -> list[str]:
    """`pip download` of exactly the pins in `missing`, as wheels for CPython `python_version` on manylinux x86_64."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return command + ["--dest", str(dest)] + [f"{d.name}=={d.locked}" for d in missing]


def check(lock_file: str, tier: str) -> int:
    try:
        lock = read_lock(lock_file, tier)
    except LockError as exc:
        print(f"gate: {exc}: the run records no lock to compare with", file=sys.stderr)
        return 0
    found = differences(lock, installed_versions())
    name = f"{lock.path} ({tier} lock {lock.sha256})"
    if not found:
        print(f"gate: this Python has every package of {name} at its version", file=sys.stderr)
        return 0
    lines = [f"gate: this Python differs from {name} in {len(found)} of its {len(lock.pins)} packages "
             "(stored runs name these, and compare only with runs that had the same):"]
    lines += [f"  {d.name}: lock {d.locked}, installed {d.installed or '(not installed)'}" for d in found]
    lines.append(f"gate: to bring the lock's wheels: ./gate wheels DIR --have FREEZE --tier {tier} on a machine "
                 "with a registry (README, 'On a GPU machine without a registry')")
    print("\n".join(lines), file=sys.stderr)
    return 0


def describe_missing(lock: Lock, have_file: str, missing: list[Difference]) -> list[str]:
    if not missing:
        return [f"{have_file} has every package of {lock.path} at its version: nothing to bring"]
    lines = [f"{len(missing)} of the {len(lock.pins)} packages of {lock.path} that {have_file} lacks or has at "
             "another version:"]
    return lines + [f"  {d.name}=={d.locked}" + (f"   ({have_file} has {d.installed})" if d.installed else "")
                    for d in missing]


def read_wanted_lock(spec: str, tier: str) -> Lock:
    """--lock: a file, or REV:PATH (a lock as committed at REV: the old lock a stack A/B judges, say)."""
    if Path(spec).is_file():
        return read_lock(spec, tier)
    return read_other_lock(spec, tier, Path.cwd(), option="--lock").lock


def wheels(args) -> int:
    lock = read_wanted_lock(args.lock, args.tier)
    missing = differences(lock, read_have(args.have))
    print("\n".join(describe_missing(lock, args.have, missing)))
    if args.list or not missing:
        return 0
    return subprocess.run(download_command(missing, args.dest, args.python_version)).returncode


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpuengine.gate.stack.cli",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("check", "wheels"):
        sub = commands.add_parser(name)
        sub.add_argument("--lock", required=True,
                         help="the lock file, e.g. locks/cuda13.txt" + (" or REV:PATH" if name == "wheels" else ""))
        sub.add_argument("--tier", required=True, choices=TIERS)
        if name == "wheels":
            sub.add_argument("dest", metavar="DIR", help="where the wheels go")
            sub.add_argument("--have", required=True, metavar="FREEZE",
                             help="`pip freeze` (or `pip list --format=json`) of the machine the wheels are for")
            sub.add_argument("--python-version", required=True, help="that machine's Python, e.g. 3.12")
            sub.add_argument("--list", action="store_true", help="list what it lacks; download nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check":
        return check(args.lock, args.tier)
    try:
        return wheels(args)
    except LockError as exc:
        print(f"gate wheels: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
