"""The seed notes' headline tables, each in its note's own layout: the note's numbers, then this GPU's.

Seed notes (docs/seeds.md): 000 (dense MLP: throughput, batches per epoch, max batch under 6 GB),
001 (MNIST CNN at batch 128 and 1024), 002 (ResNet-50 on CIFAR-10/100), 003 (model zoo, ms per batch
of 16 at 224x224), 004 (Transformer by sequence length, energy per sample). The notes measured fp32
with each framework's default TF32 policy: here that is the `tf32` precision. Every row is keyed on
test names (wildcards `*`, `?`), so a row fills in by itself once a stored run carries its test, and
says "not measured yet" until then; of several matching tests the fastest engine is shown, as the
notes show each engine at its best settings, and every cell names its test and run. A figure is the
newest measurement of its test: one from a run that failed the gate says "failed run" and gives the
baseline in force's figure beside it, and each table's caption names its runs, commits and verdicts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .store import ENGINE, Benchmark, Run, TierRuns
from .sections import runs_text, source
from .tables import FAILED_RUN, NONE, NOT_MEASURED, Cell, Table, count, rate, span, speedup
from .tables import note_cell as note   # short: every note figure in the tables below goes through it

PRECISION = "tf32"
Found = tuple[Run, Benchmark]


@dataclass
class Sources:
    """Looks tests up in one tier and remembers which runs the figures came from, for the caption: the
    newest run of each test, passed or failed, and the baselines in force beside the failed ones."""

    tier: TierRuns
    used: dict[str, Run] = field(default_factory=dict)
    baselines: dict[str, Run] = field(default_factory=dict)

    def find(self, pattern: str, precision: str | None = PRECISION) -> Found | None:
        found = self.tier.find(pattern, precision)
        if found is not None:
            self.used[found[0].label] = found[0]
            baseline = self.tier.baseline_of(*found)
            if not found[0].passed and baseline is not None:
                self.baselines[baseline[0].label] = baseline[0]
        return found

    def caption(self, keyed_on: str) -> str:
        here = self.tier.gpu
        if not self.used:
            return f"{here}: no stored run holds these tests yet. Rows key on {keyed_on}."
        runs = ", ".join(f"{run.label} ({run.date}, {run.status}, {run.path.parent})" for run in self.used.values())
        text = f"{here}, newest run{'s' if len(self.used) > 1 else ''} of these tests: {runs}."
        if any(not run.passed for run in self.used.values()):
            text += (f" A figure from a run that failed the gate says \"{FAILED_RUN}\" and gives the baseline in "
                     "force, the newest passing run of that test"
                     + (f" ({runs_text(self.baselines.values())})." if self.baselines else "."))
        return f"{text} Rows key on {keyed_on}."


def measured(tier: TierRuns, found: Found | None, value: Callable[[Benchmark], str]) -> Cell:
    """One figure of one stored test's newest measurement, or 'not measured yet' when no run holds the test.
    From a failed run, the figure says so and gives the baseline in force's figure beside it."""
    if found is None:
        return Cell(NOT_MEASURED)
    run, bench = found
    if run.passed:
        return Cell(value(bench), source(run, bench))
    baseline = tier.baseline_of(run, bench)
    text, beside = value(bench), NONE if baseline is None else value(baseline[1])
    if text == NONE and beside == NONE:   # the runner has no such figure, then or now: nothing to mark
        return Cell(NONE, source(run, bench), failed=True)
    if baseline is None:
        return Cell(f"{text} [{FAILED_RUN}; no baseline]", source(run, bench), failed=True)
    return Cell(f"{text} [{FAILED_RUN}; baseline {beside}]",
                f"{source(run, bench)}; baseline in force: {source(*baseline)}", failed=True)


def measured_span(tier: TierRuns, founds: list[Found], value: Callable[[Benchmark], float | None], fmt) -> Cell:
    """The range of one figure over several stored tests ('72.0–133 M/s'); if any came from a failed run,
    marked so, with the range of the baselines in force beside it."""
    if not founds:
        return Cell(NOT_MEASURED)
    values = [v for v in (value(bench) for _, bench in founds) if v is not None]
    where = "; ".join(source(run, bench) for run, bench in founds)
    if all(run.passed for run, _ in founds):
        return Cell(span(values, fmt), where)
    baselines = [found for found in (tier.baseline_of(*f) for f in founds) if found is not None]
    in_force = [v for v in (value(bench) for _, bench in baselines) if v is not None]
    beside = f"baseline {span(in_force, fmt)}" if baselines else "no baseline"
    return Cell(f"{span(values, fmt)} [{FAILED_RUN}; {beside}]",
                f"{where}; baselines in force: {'; '.join(source(*f) for f in baselines) or 'none'}", failed=True)


def throughput_of(runner: str) -> Callable[[Benchmark], float | None]:
    return lambda bench: bench.throughput(bench.engine if runner == "engine" else runner)


def ratio_of(reference: str) -> Callable[[Benchmark], float | None]:
    return lambda bench: (bench.ratio(reference) or {}).get("median")


def rate_of(runner: str) -> Callable[[Benchmark], str]:
    return lambda bench: rate(throughput_of(runner)(bench))


def count_of(runner: str) -> Callable[[Benchmark], str]:
    return lambda bench: count(throughput_of(runner)(bench))


def speedup_over(reference: str) -> Callable[[Benchmark], str]:
    return lambda bench: speedup(ratio_of(reference)(bench))


def max_batch_of(variant: str) -> Callable[[Benchmark], str]:
    """A runner's largest batch in a test_mlp_max_batch record ('engine': the engine variant searched)."""
    def text(bench: Benchmark) -> str:
        searches = bench.info.get("max_batch") or {}
        engines = [k for k in searches if k.split("[", 1)[0] == ENGINE]   # "gpuengine" or "gpuengine[resident]"
        name = (engines[0] if len(engines) == 1 else None) if variant == "engine" else variant
        return count((searches.get(name) or {}).get("max_batch"))
    return text


def seed_000(tier: TierRuns) -> list[Table]:
    """Dense Rosenbrock MLP: the result, inference by batch, training by batches per epoch, max batch."""
    gpu = tier.gpu
    result_sources, infer_sources, train_sources, batch_sources = (Sources(tier) for _ in range(4))
    infer = "test_mlp_infer[tf32-resident-b{}]"
    train = "test_mlp_train[tf32-graph8-resident-bpe{}]"
    max_batch = "test_mlp_max_batch[tf32-cap6-{}-{}]"

    result = Table("Seed 000 — the result: dense MLP 1000→1000 tanh→1, TF32",
                   ["Axis", "OpenNN (note)", "PyTorch (note)", "OpenNN vs PyTorch (note)", f"gpuengine ({gpu})",
                    f"torch_eager ({gpu})", "vs torch_eager", "vs torch_graph"])
    wide = [f for f in (result_sources.find(infer.format(b)) for b in (2000, 8000, 32000)) if f]
    result.add("Inference throughput (batch ≥ 2000)", note("3.8–4.4 M/s", "000"), note("2.5–2.8 M/s", "000"),
               note("1.43–1.56×", "000"), measured_span(tier, wide, throughput_of("engine"), rate),
               measured_span(tier, wide, throughput_of("torch_eager"), rate),
               measured_span(tier, wide, ratio_of("torch_eager"), speedup),
               measured_span(tier, wide, ratio_of("torch_graph"), speedup))
    one = result_sources.find(train.format(1))
    result.add("Training throughput (1 batch per epoch)", note("1.77 M/s", "000"), note("1.31 M/s", "000"),
               note("1.35×", "000"), measured(tier, one, rate_of("engine")),
               measured(tier, one, rate_of("torch_eager")),
               measured(tier, one, speedup_over("torch_eager")),
               measured(tier, one, speedup_over("torch_graph")))
    for mode, label, ours, theirs, ratio in (("train", "Max training batch (6 GB / 6 GiB cap)", "482,344",
                                              "399,507", "1.21×"),
                                             ("infer", "Max inference batch (6 GB / 6 GiB cap)", "524,288",
                                              "534,773", "0.98× (tie)")):
        eager = result_sources.find(max_batch.format(mode, "torch_eager"))
        graph = result_sources.find(max_batch.format(mode, "torch_graph"))
        result.add(label, note(ours, "000"), note(theirs, "000"), note(ratio, "000"),
                   measured(tier, eager, max_batch_of("engine")), measured(tier, eager, max_batch_of("torch_eager")),
                   measured(tier, eager, lambda b: speedup(b.info.get("ratio"))),
                   measured(tier, graph, lambda b: speedup(b.info.get("ratio"))))
    result.caption = ("Note: RTX 3060 Laptop (6 GB), WSL2, fp32 with TF32, each engine alone. "
                      + result_sources.caption(f"{infer.format('2000|8000|32000')}, {train.format(1)}, "
                                               f"{max_batch.format('train|infer', 'torch_eager|torch_graph')}"))

    sweep = Table("Seed 000 — inference: keep everything on the device (samples/s)",
                  ["Batch", "OpenNN one-shot (note)", "OpenNN resident (note)", "PyTorch resident (note)",
                   "vs PyTorch (note)", "gpuengine one-shot", "gpuengine resident", "torch_eager", "vs torch_eager",
                   "vs torch_graph"])
    for batch, *noted in ((512, "339 K", "2.19 M", "2.24 M", "0.98×"), (2000, "742 K", "3.83 M", "2.49 M", "1.54×"),
                          (8000, "870 K", "3.99 M", "2.80 M", "1.43×"),
                          (32000, "1.02 M", "4.36 M", "2.79 M", "1.56×")):
        found = infer_sources.find(infer.format(batch))
        sweep.add(f"{batch:,}", *(note(text, "000") for text in noted),
                  measured(tier, found, rate_of("gpuengine_oneshot")),
                  measured(tier, found, rate_of("engine")),
                  measured(tier, found, rate_of("torch_eager")),
                  measured(tier, found, speedup_over("torch_eager")),
                  measured(tier, found, speedup_over("torch_graph")))
    sweep.caption = infer_sources.caption(infer.format("<batch>"))

    epochs = Table("Seed 000 — training: mini-batches per epoch at batch 8000",
                   ["Mini-batches / epoch", "OpenNN (note)", "vs PyTorch 1.31 M/s (note)", "gpuengine",
                    "torch_eager", "vs torch_eager", "torch_graph", "vs torch_graph"])
    for batches, *noted in ((1, "1.77 M/s", "1.35×"), (4, "1.71 M/s", "1.30×"), (12, "1.39 M/s", "1.06×"),
                            (50, "0.90 M/s", "0.69×")):
        found = train_sources.find(train.format(batches))
        epochs.add(str(batches), *(note(text, "000") for text in noted),
                   measured(tier, found, rate_of("engine")),
                   measured(tier, found, rate_of("torch_eager")),
                   measured(tier, found, speedup_over("torch_eager")),
                   measured(tier, found, rate_of("torch_graph")),
                   measured(tier, found, speedup_over("torch_graph")))
    epochs.caption = ("The engine at 8 training steps per CUDA graph launch, data resident. "
                      + train_sources.caption(train.format("<batches>")))

    batches = Table("Seed 000 — max batch: one training step / one inference pass under a 6 GiB cap",
                    ["Note's engine", "Here", "Training (note)", "Inference (note)", "Training (here)",
                     "Inference (here)"])
    pool_cost = batch_sources.find("test_mlp_max_batch_pool_cost")
    for reference, (engine, at_train, at_infer) in (("torch_eager", ("PyTorch", "399,507", "534,773")),
                                                    ("torch_compile", (NONE, NONE, NONE)),
                                                    ("torch_graph", (NONE, NONE, NONE))):
        train_found = batch_sources.find(max_batch.format("train", reference))
        infer_found = batch_sources.find(max_batch.format("infer", reference))
        batches.add(note(engine, "000"), reference, note(at_train, "000"), note(at_infer, "000"),
                    measured(tier, train_found, max_batch_of(reference)),
                    measured(tier, infer_found, max_batch_of(reference)))
    engine_train = batch_sources.find(max_batch.format("train", "torch_eager"))
    engine_infer = batch_sources.find(max_batch.format("infer", "torch_eager"))
    batches.add(note("OpenNN, pool of 3 (default)", "000"), "gpuengine streamed, batch_pool 2 (default)",
                note("306,708", "000"), note(NONE, "000"),
                measured(tier, pool_cost, max_batch_of("gpuengine[streamed,pool=2]")), Cell(NONE))
    batches.add(note("OpenNN, pool of 1", "000"), "gpuengine streamed, batch_pool 1", note("482,344", "000"),
                note("524,288", "000"), measured(tier, pool_cost, max_batch_of("gpuengine[streamed,pool=1]")),
                Cell(NONE))
    batches.add(Cell(NONE), "gpuengine resident", Cell(NONE), Cell(NONE),
                measured(tier, engine_train, max_batch_of("engine")),
                measured(tier, engine_infer, max_batch_of("engine")))
    batches.caption = ("Note: capped to the card's physical 6 GB. "
                       + batch_sources.caption(f"{max_batch.format('train|infer', '<reference>')}, "
                                               "test_mlp_max_batch_pool_cost"))
    return [result, sweep, epochs, batches]


def seed_001(tier: TierRuns) -> list[Table]:
    """MNIST CNN training throughput at batch 128 and 1024, engines as rows."""
    gpu, sources = tier.gpu, Sources(tier)
    train, keras = "test_cnn_train[tf32-graph8-resident-b{}]", "test_cnn_train_vs_keras[tf32-graph8-resident-b{}]"
    table = Table("Seed 001 — CNN training throughput (samples/s; note: epoch wall time in parentheses)",
                  ["Engine", "Batch 128 (note)", f"Batch 128 ({gpu})", "Batch 1,024 (note)", f"Batch 1,024 ({gpu})"])
    found = {b: sources.find(train.format(b)) for b in (128, 1024)}
    with_keras = {b: sources.find(keras.format(b)) for b in (128, 1024)}
    rows = (("gpuengine (OpenNN in the note)", "engine", "195,000–212,000 (0.047 s)", "397,259 (0.025 s)", found),
            ("torch_eager (PyTorch eager)", "torch_eager", "111,241 (0.090 s)", "298,947 (0.034 s)", found),
            ("torch_compile", "torch_compile", NONE, NONE, found),
            ("torch_graph", "torch_graph", NONE, NONE, found),
            ("tf_keras (TensorFlow, Keras fit)", "tf_keras", "55,339 (0.181 s)", "134,307 (0.075 s)", with_keras))
    for label, runner, at_128, at_1024, where in rows:
        table.add(label, note(at_128, "001"), measured(tier, where[128], count_of(runner)),
                  note(at_1024, "001"), measured(tier, where[1024], count_of(runner)))
    for label, reference, at_128, at_1024, where in (
            ("engine vs torch_eager", "torch_eager", "1.9×", "1.3×", found),
            ("engine vs torch_graph", "torch_graph", NONE, NONE, found),
            ("engine vs tf_keras", "tf_keras", "2.9–3.8× (both sizes)", "2.9–3.8× (both sizes)", with_keras)):
        table.add(label, note(at_128, "001"), measured(tier, where[128], speedup_over(reference)),
                  note(at_1024, "001"), measured(tier, where[1024], speedup_over(reference)))
    table.caption = ("Note: RTX 3060 Laptop, fp32 with TF32, 40 timed epochs after 2 warm-up. The engine at 8 "
                     "steps per graph launch, data resident. "
                     + sources.caption(f"{train.format('128|1024')}, {keras.format('128|1024')}"))
    return [table]


def seed_002(tier: TierRuns) -> list[Table]:
    """ResNet-50 v1.5 training at batch 128 on CIFAR-10 and CIFAR-100."""
    sources = Sources(tier)
    pattern = "test_resnet_train[{}-tf32-graph8-resident-b128]"   # the case that races all three references
    table = Table("Seed 002 — ResNet-50 training throughput, batch 128 (samples/s)",
                  ["Dataset", "OpenNN, CUDA graph (note)", "torch.compile (note)", "PyTorch eager (note)",
                   "OpenNN vs compile / eager (note)", "gpuengine", "torch_compile", "torch_eager", "torch_graph",
                   "vs compile / eager", "vs torch_graph"])
    for dataset, label, noted in (("cifar10", "CIFAR-10", ("8,433", "5,268", "3,960", "1.6× / 2.1×")),
                                  ("cifar100", "CIFAR-100", ("8,702", "5,000", "4,124", "1.7× / 2.1×"))):
        found = sources.find(pattern.format(dataset))
        table.add(label, *(note(text, "002") for text in noted),
                  *(measured(tier, found, count_of(runner))
                    for runner in ("engine", "torch_compile", "torch_eager", "torch_graph")),
                  measured(tier, found, lambda b: f"{speedup(ratio_of('torch_compile')(b))} / "
                                            f"{speedup(ratio_of('torch_eager')(b))}"),
                  measured(tier, found, speedup_over("torch_graph")))
    table.caption = "Note: RTX 3060 Laptop, fp32 with TF32, data resident. " + sources.caption(
        pattern.format("cifar10|cifar100"))
    return [table]


ZOO_MODELS = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2")
ZOO_NOTE = (("pytorch/opencl", "AMD rx 6600xt", "56.846 109.850 258.973 365.305 163.732"),
            ("dlprimitives", "AMD rx 6600xt", "36.954 65.241 194.398 308.763 99.862"),
            ("pytorch/cuda", "Nvidia rtx 2060s", "27.592 38.624 114.074 179.580 49.624"),
            ("pytorch/opencl", "Nvidia rtx 2060s", "50.108 82.021 223.651 462.964 129.145"),
            ("dlprimitives", "Nvidia rtx 2060s", "39.829 67.960 187.398 439.053 90.229"),
            ("tf2/cuda", "Nvidia rtx 2060s", "29.165 55.523 147.999 156.714 102.596"),
            ("pytorch/cuda", "Nvidia gtx 1080", "38.310 44.382 137.754 232.824 63.324"),
            ("pytorch/opencl", "Nvidia gtx 1080", "54.828 85.016 301.898 411.928 173.885"),
            ("dlprimitives", "Nvidia gtx 1080", "38.804 71.147 264.286 374.168 134.650"),
            ("tf2/cuda", "Nvidia gtx 1080", "35.592 69.071 189.994 197.333 128.526"))
ZOO_BATCH = 16


def seed_003(tier: TierRuns) -> list[Table]:
    """The 224x224 model zoo: milliseconds per training batch of 16, frameworks as rows."""
    sources = Sources(tier)
    pattern = "test_zoo_train[{}-*-b16]"
    table = Table("Seed 003 — model zoo training, batch 16 of 224×224 (ms per batch, lower is better)",
                  ["Framework", "GPU", "alexnet", "resnet18", "resnet50", "vgg16", "mobilenet"])
    for framework, gpu, times in ZOO_NOTE:
        table.add(note(framework, "003"), note(gpu, "003"), *(note(t, "003") for t in times.split()))
    found = [sources.find(pattern.format(model)) for model in ZOO_MODELS]
    for runner in ("engine", "torch_eager", "torch_compile", "torch_graph", "tf_keras"):
        def ms_per_batch(bench: Benchmark) -> str:
            samples_per_s = throughput_of(runner)(bench)
            return NONE if not samples_per_s else f"{1e3 * ZOO_BATCH / samples_per_s:.3f}"
        table.add("gpuengine" if runner == "engine" else runner, tier.gpu,
                  *(measured(tier, f, ms_per_batch) for f in found))
    cases = [f[1].case for f in found if f is not None]   # which precision and data path the rows really are
    table.caption = ("Note: ms per batch of 16, fp32 with each framework's default TF32 policy. Here, per model, the "
                     f"fastest case of the newest run holding one: {', '.join(cases) or 'none yet'} (tf32: TF32 "
                     "tensor cores, fp32 storage; "
                     "streamed: each batch copied from host memory, resident: on the device). "
                     + sources.caption(pattern.format("<model>")))
    return [table]


def seed_004(tier: TierRuns) -> list[Table]:
    """Transformer training by sequence length, and energy per sample at sequence 256."""
    sources, energy_sources = Sources(tier), Sources(tier)
    pattern = "test_transformer_train[seq{}-*-b16]"   # the engine as it ships: the -nondeterministic cases left out
    table = Table("Seed 004 — Transformer training (samples/s): d_model 256, 8 heads, ff 1024, 2+2 layers, batch 16",
                  ["Sequence length", "OpenNN (note)", "PyTorch (note)", "ratio (note)", "gpuengine", "torch_eager",
                   "torch_graph", "vs torch_eager", "vs torch_graph"])
    for length, *noted in ((64, "1,653", "1,363", "1.21×"), (128, "999", "963", "1.04×"),
                           (256, "512", "347", "1.48×"), (384, "400", "236", "1.69×")):
        found = sources.find(pattern.format(length))
        table.add(str(length), *(note(text, "004") for text in noted),
                  *(measured(tier, found, count_of(runner))
                    for runner in ("engine", "torch_eager", "torch_graph")),
                  measured(tier, found, speedup_over("torch_eager")),
                  measured(tier, found, speedup_over("torch_graph")))
    table.caption = "Note: RTX 3060 Laptop, fp32. " + sources.caption(pattern.format("<length>"))

    energy_pattern = "test_transformer_train_energy[*seq256*]"
    energy = Table("Seed 004 — energy per training sample at sequence 256",
                   ["", "OpenNN (note)", "PyTorch (note)", "gpuengine", "torch_eager", "torch_graph"])
    found = energy_sources.find(energy_pattern)
    for label, key, noted, fmt in (("Average power", "avg_power_w", ("93.2 W", "74.1 W"), "{:.1f} W"),
                                   ("Energy per sample", "total_j_per_sample", ("0.169 J", "0.220 J"), "{:.3g} J")):
        def figure(bench: Benchmark, runner: str) -> str:
            value = (bench.info.get("energy") or {}).get(key, {}).get(bench.engine if runner == "engine" else runner)
            return NONE if value is None else fmt.format(value)
        energy.add(label, *(note(text, "004") for text in noted),
                   *(measured(tier, found, lambda b: figure(b, runner))
                     for runner in ("engine", "torch_eager", "torch_graph")))
    energy.caption = "Note: 20 Hz power integrated over the run. " + energy_sources.caption(energy_pattern)
    return [table, energy]


SEED_TABLES = (seed_000, seed_001, seed_002, seed_003, seed_004)


def seed_tables(tier: TierRuns) -> list[Table]:
    return [table for build in SEED_TABLES for table in build(tier)]
