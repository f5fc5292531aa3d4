"""Two kernel profiles side by side, base and head: which op families and kernels took more or less time per step.

    python -m gpuengine profile-diff BASE.json HEAD.json [--runner gpuengine] [--top 10]

BASE and HEAD are profiles as `python -m gpuengine profile` writes them
(record.py), typically of one case at two commits (`profile WORKLOAD
--against REV` makes both and prints this diff; so does the gate for an A/B
test that regressed, gpuengine/gate/regression_profiles.py). For one runner
(the engine by default) it gives, in microseconds per training step: the
totals (the step timed without the profiler, the profiled span, the kernels'
sum, the gaps between them, launches per step), each op family, and each
kernel, sorted by how far its time moved either way. A kernel is matched by
its full name: one that only the head runs is "new", one only the base ran
"gone", so a change of kernel (another cuBLAS algorithm, a new fused kernel)
reads as one gone and one new. Profiles of different cases or GPUs are
compared all the same, with a note saying so. A pure function of the two
records; no GPU is needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..json_files import load_json
from .families import label, ordered
from .record import ENGINE, TIMED, UNAVAILABLE, StoredProfile, read_profile

DEFAULT_TOP = 10   # kernels shown; the families are always all shown
NAME_WIDTH = 72    # a kernel name's characters in the table (cuDNN's and ATen's run to hundreds)


@dataclass(frozen=True)
class Moved:
    """One row of the diff: microseconds per step on each side (None: the side does not have it)."""

    name: str
    base_us: float | None
    head_us: float | None
    family: str = ""
    unit: str = "µs"   # launches per step are counted, not timed

    @property
    def change_us(self) -> float:
        return (self.head_us or 0.0) - (self.base_us or 0.0)

    @property
    def relative(self) -> float | None:
        """The change over the base's time; None where the base had none (a new kernel)."""
        return self.change_us / self.base_us if self.base_us else None

    def describe_change(self) -> str:
        """'+50.1 µs (+6.2%)', '+12.0 µs (new)', '-3.0 µs (gone)', '+1.0 launches (+12.5%)'."""
        if self.base_us is None:
            why = "new"
        elif self.head_us is None:
            why = "gone"
        else:
            why = f"{self.relative:+.1%}" if self.relative is not None else "from 0"
        return f"{self.change_us:+,.1f} {self.unit} ({why})"


@dataclass(frozen=True)
class ProfileDiff:
    base: StoredProfile
    head: StoredProfile
    runner: str
    totals: list[Moved]      # in a fixed order: timed step, span, kernels' sum, gaps, launches per step
    families: list[Moved]    # by how far they moved, the largest change first
    kernels: list[Moved]     # likewise
    notes: list[str]         # what differs between the two profiles beside the code

    def top(self, count: int) -> list[Moved]:
        """The `count` kernels whose time moved most (either way)."""
        return self.kernels[:count]


def load_profile(path: Path | str) -> StoredProfile:
    """A profile file read and checked (record.read_profile); JsonFileError naming the file and the fault."""
    return read_profile(load_json(path), path)


def _profiled_runner(profile: StoredProfile, runner: str) -> dict:
    if runner not in profile.runners:
        raise ValueError(f"{profile.path}: no runner {runner!r} (it has {', '.join(profile.runners)})")
    if UNAVAILABLE in profile.runners[runner]:
        raise ValueError(f"{profile.path}: {runner} was not profiled: {profile.runners[runner][UNAVAILABLE]}")
    return profile.runners[runner]


def by_change(rows: list[Moved]) -> list[Moved]:
    """Largest move first (either way), then by name, so equal moves keep one order."""
    return sorted(rows, key=lambda row: (-abs(row.change_us), row.name))


def _notes(base: StoredProfile, head: StoredProfile, runner: str) -> list[str]:
    notes = []
    timed = [p.path for p in (base, head) if TIMED in p.runners[runner]]
    if len(timed) == 1:
        notes.append(f"only {timed[0]} has the step timed without the profiler (older profiles lack it)")
    if base.case_key != head.case_key:
        notes.append(f"different cases: {base.title} and {head.title}")
    if base.gpu != head.gpu:
        notes.append(f"different GPUs: {base.gpu} and {head.gpu}")
    return notes


def diff_profiles(base: StoredProfile, head: StoredProfile, runner: str = ENGINE) -> ProfileDiff:
    """The diff of `runner` between two profiles; ValueError naming the file where a profile lacks the runner."""
    old, new = _profiled_runner(base, runner), _profiled_runner(head, runner)
    totals = [Moved("step timed, no profiler", old[TIMED], new[TIMED])] if TIMED in old and TIMED in new else []
    totals += [Moved("step (device span)", old["step_us"], new["step_us"]),
               Moved("kernels (sum)", old["kernel_us"], new["kernel_us"]),
               Moved("gaps (device idle)", old["gaps_us"], new["gaps_us"]),
               Moved("launches per step", sum(k.get("count", 0) for k in old["kernels"]),
                     sum(k.get("count", 0) for k in new["kernels"]), unit="launches")]
    names = ordered(set(old["families"]) | set(new["families"]))
    families = [Moved(label(f), old["families"].get(f), new["families"].get(f), f) for f in names]
    before = {k["name"]: k for k in old["kernels"]}
    after = {k["name"]: k for k in new["kernels"]}
    kernels = [Moved(name, before[name]["us"] if name in before else None, after[name]["us"] if name in after else None,
                     (after.get(name) or before[name]).get("family", "")) for name in {**before, **after}]
    return ProfileDiff(base, head, runner, totals, by_change(families), by_change(kernels), _notes(base, head, runner))


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _short(name: str, width: int = NAME_WIDTH) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def _who(profile: StoredProfile) -> str:
    commit = (profile.commit[:7] or "?") + ("+dirty" if profile.dirty else "")
    return f"{commit} ({profile.path})"


def format_diff(diff: ProfileDiff, top: int = DEFAULT_TOP) -> str:
    """The diff as text: who was compared, the totals, every family and the `top` kernels that moved most."""
    width = NAME_WIDTH + 2
    head_row = "".rjust(width) + "base".rjust(11) + "head".rjust(11) + "   change"
    lines = [f"{diff.runner}: base {_who(diff.base)}, head {_who(diff.head)}",
             f"{diff.head.title} on {diff.head.gpu}: µs per training step", *(f"note: {n}" for n in diff.notes),
             head_row]

    def row(moved: Moved, name: str) -> str:
        return (f"{name.ljust(width)}{_us(moved.base_us).rjust(11)}{_us(moved.head_us).rjust(11)}   "
                f"{moved.describe_change()}")

    lines += [row(t, t.name) for t in diff.totals]
    lines += ["op families, largest change first:"] + [row(f, "  " + f.name) for f in diff.families]
    shown = diff.top(top)
    lines.append(f"kernels whose time moved most ({len(shown)} of {len(diff.kernels)}), largest change first:")
    lines += [row(k, "  " + _short(k.name, NAME_WIDTH - 2)) + f"  [{label(k.family)}]" for k in shown]
    return "\n".join(lines)
