"""The gate keeps the engine's cuDNN plan choices with its baselines (gpuengine/bench/cudnn_plans.py).

On a GPU tier a perf session starts the engine from the plans stored for this
GPU kind, so it runs what its baseline ran; graphs without a stored choice
(new shapes, or a stored plan this cuDNN no longer builds) are autotuned as
usual, and a saved run (`./gate perf` autosaves) adds those choices to the
file whether it passed or not: a stored choice changes only when it no longer
builds or with `--retune-cudnn` (every graph autotuned afresh, the file's
choices replaced by the new ones), so a run that fails still pins its plans
for the next. In a spread run (several GPUs, gpuengine/gate/spread.py) each
GPU's session hands its choices to the spread through GATE_PLANS_OUT and the
spread alone writes the file. A gatepower study or calibration session, or an
interrupted one, never writes the file.
"""
from __future__ import annotations

import os

import pytest

from gpuengine.bench import cudnn_plans
from gpuengine.bench.json_files import JsonFileError

from .plugin import GATE

KEPT = pytest.StashKey[dict]()


def add_options(parser):
    parser.getgroup("gpuengine gate").addoption(
        "--retune-cudnn", action="store_true", default=False,
        help="autotune every cuDNN graph afresh instead of reusing the plans stored for this GPU kind")


def configure(config):
    """The stored plan choices in force for the session (after the root conftest settled the gate's state)."""
    state = config.stash.get(GATE, None)
    if state is None or not state.tier.on_gpu:
        return
    from gpuengine.ops import autotune
    path = config.rootpath / "baselines_store" / state.tier.name / cudnn_plans.PLAN_FILE
    try:
        stack = cudnn_plans.current_stack()
    except ImportError as exc:   # the engine's GPU tests will say the same; the perf tests then skip or fail
        state.notices.append(f"cuDNN plans: not kept ({exc})")
        return
    try:
        stored = cudnn_plans.load(path, stack)
    except JsonFileError as exc:
        raise pytest.UsageError(f"gpuengine: {exc} (delete it, or run with --retune-cudnn after fixing it)") from exc
    retune = config.getoption("retune_cudnn")
    choices = autotune.use_plan_choices({} if retune else stored.presets())
    config.stash[KEPT] = {"file": stored, "choices": choices, "saved": None, "handed": None}
    if stored.set_aside:
        state.notices.append(f"cuDNN plans in {path.name} {stored.set_aside}")
    elif retune:
        state.notices.append(f"cuDNN plans: --retune-cudnn, all graphs autotuned afresh ({len(stored.plans)} stored)")
    else:
        state.notices.append(f"cuDNN plans: {len(stored.plans)} autotuned choices reused from {path.name} "
                             "(--retune-cudnn times them afresh)")


@pytest.fixture
def kept_plan_choices(request):
    """The engine's plan choices this session keeps (autotune.PlanChoices; None where none are kept): a test whose
    engine runs in processes of its own (data parallel) starts them from its `in_force()` and `adopt`s theirs."""
    kept = request.config.stash.get(KEPT, None)
    return kept["choices"] if kept is not None else None


def finish(session):
    kept = session.config.stash.get(KEPT, None)
    state = session.config.stash.get(GATE, None)
    if kept is None or state is None or state.study is not None or state.interrupted:
        return   # an interrupted session stores nothing (plugin.py), its plan choices included
    option = session.config.option
    handoff = os.environ.get(cudnn_plans.HAND_OFF_ENV)
    if handoff:
        kept["handed"] = cudnn_plans.hand_off(handoff, kept["file"], kept["choices"].tuned)
    elif getattr(option, "benchmark_save", None) or getattr(option, "benchmark_autosave", None):
        kept["saved"] = kept["file"].save(kept["choices"].tuned)


def terminal_summary(terminalreporter):
    kept = terminalreporter.config.stash.get(KEPT, None)
    if kept is None:
        return
    tuned = len(kept["choices"].tuned)
    if kept["saved"]:
        terminalreporter.write_line(f"cuDNN plans: {kept['saved']} new choices saved to {kept['file'].path}")
    elif kept["handed"]:
        terminalreporter.write_line(f"cuDNN plans: {kept['handed']} new choices handed to the spread run to keep")
    elif tuned:
        why = "it was interrupted" if terminalreporter.config.stash[GATE].interrupted else "./gate perf saves"
        terminalreporter.write_line(f"cuDNN plans: {tuned} graphs autotuned afresh, not kept (this run was not "
                                    f"saved: {why})")
