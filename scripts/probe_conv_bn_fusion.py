"""Development probe (issue #8): does cuDNN 9.19 fuse BatchNorm into ResNet-50's convolutions, and what would
that save per step? One GPU call, about 2-3 minutes.

For every distinct (conv -> BN [-> ReLU]) site of ResNet-50 v1.5 at batch 128 on 32x32 inputs
(conv_bn_sites.py, from the engine's own network) and each precision, it times four sequences of launches:
  F0  today's forward: the engine's Conv2D and BatchNorm2D layers (their real cuDNN graphs)
  F1  fused forward: [relu(s*x + b) prologue ->] conv -> genstats graph, finalize kernel, and an apply kernel
      where the BN output must be written (conv_bn_fusion_gpu.py)
  B0  today's backward: the engine layers' dReLU + dBN graph, conv dgrad and conv wgrad (+ bf16 widening)
  B1  fused backward: this BN's sums (unless the next conv's dgrad made them) + dBN finalize + dBN apply kernels,
      conv dgrad [-> relu_backward + the previous BN's sums] and wgrad [with the prologue] graphs
Each fused piece tries its variants in order (reported as notes), so an unsupported graph is a note, not a
crash. Every sequence runs eagerly once (autotuning each cuDNN graph as the engine does), is checked against
float64 NumPy on the same inputs, then is captured 20 times into one CUDA graph and timed with device events:
the median of 20 replays, divided by 20. Output: one table per precision and the summed per-step estimate,
printed line by line and written as JSON to $OUT (or /tmp). Run on a GPU machine from the repository root:
    PYTHONPATH=$PWD python scripts/probe_conv_bn_fusion.py [--budget-s 150] [--precisions bf16,tf32]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


from conv_bn_site_run import SiteRun, log
from conv_bn_sites import conv_bn_sites, distinct_sites, format_table, step_estimate

LAUNCHES, REPEATS = 20, 20   # sequences per captured graph, timed replays
TOLERANCE = {"tf32": 2e-2, "bf16": 5e-2}   # relative error vs float64; near-zero ReLU flips move a few terms
def time_sequence(backend, launches: list) -> tuple[float, str]:
    """Device microseconds per run of `launches`: LAUNCHES runs captured in one CUDA graph, the median of
    REPEATS replays (eager, with a note, where capture fails)."""
    from gpuengine.runtime.capture import GraphCapturedStep

    def run():
        for launch in launches:
            launch()

    timer, note = backend.timer(), ""
    with backend.activate():
        try:
            captured = GraphCapturedStep(backend, run, LAUNCHES, {})
            captured.capture()
            replay = captured.launch
        except Exception as exc:   # a piece that cannot be captured is timed eagerly (host launch rate included)
            note = f"eager timing ({type(exc).__name__}: {str(exc)[:120]})"

            def replay():
                for _ in range(LAUNCHES):
                    run()
        for _ in range(3):
            replay()
        backend.synchronize()
        times = []
        for _ in range(REPEATS):
            timer.start()
            replay()
            times.append(timer.stop())
    return statistics.median(times) / LAUNCHES * 1e3, note


def plan_names(run: SiteRun) -> dict:
    """The plan autotuning kept for each fused cuDNN graph of the site (names say runtime fusion or not)."""
    names = {}
    for name, bound in run.graphs.items():
        graph = bound.graph
        try:
            names[name] = {"plan": graph.graph.get_plan_name_at_index(graph.plan), "candidates": len(graph.plans),
                           "plan_ms": graph.plan_times_ms}
        except Exception as exc:   # informative only
            names[name] = f"? ({type(exc).__name__}: {exc})"
    return names


def probe_site(site, names: list, precision: str, backend, check: bool) -> dict:
    """One row of the table: the four timings, the pieces cuDNN accepted, numerics; errors as notes."""
    row = {"site": site.describe(), "nodes": names, "multiplicity": len(names), "precision": precision,
           "us": {p: None for p in ("F0", "F1", "B0", "B1")}, "notes": [], "numerics": {}, "numerics_ok": None}
    try:
        run = SiteRun(site, precision, backend, seed=len(names))
        forward, backward = run.build_fused()
        row["notes"] = run.notes
        sequences = dict(run.sequences)
        if forward is not None:
            sequences["F1"] = forward
        if backward is not None:
            sequences["B1"] = backward
        with backend.activate():   # eager runs first: autotuning, and capture needs every plan chosen
            for name in ("F0", "B0"):
                for launch in sequences[name]:
                    launch()
        if check and forward is not None and backward is not None:
            row["numerics"] = run.check(lambda: [f() for f in forward], lambda: [f() for f in backward])
            bad = {k: v for k, v in row["numerics"].items() if not v <= TOLERANCE[precision]}
            row["numerics_ok"] = not bad
            if bad:
                row["notes"].append("NUMERICS FAIL " + ", ".join(f"{k} {v:.2e}" for k, v in bad.items()))
        elif forward is not None and backward is not None:
            with backend.activate():
                for launch in forward + backward:
                    launch()
        for name, launches in sequences.items():
            row["us"][name], note = time_sequence(backend, launches)
            if note:
                row["notes"].append(f"{name}: {note}")
        row["plans"] = plan_names(run)
    except Exception as exc:   # one broken site must not end the probe
        import traceback
        row["notes"].append(f"ERROR {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        traceback.print_exc()
    finally:
        backend.synchronize()
        backend.xp.get_default_memory_pool().free_all_blocks()
    return row


def environment() -> dict:
    import cudnn
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(0)
    return {"gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "cudnn": cudnn.backend_version(), "cudnn_frontend": cudnn.__version__, "cupy": cupy.__version__}


def write_json(path: Path, payload: dict):
    path.write_text(json.dumps(payload, indent=1, default=str))


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-s", type=float, default=150.0, help="start no new site after this many seconds")
    parser.add_argument("--precisions", default="bf16,tf32", help="comma-separated: bf16 (bf16 I/O), tf32 "
                                                                  "(float32 I/O, TF32 compute)")
    parser.add_argument("--max-sites", type=int, default=None, help="probe only the N most frequent site shapes")
    parser.add_argument("--smoke", action="store_true", help="the CPU tier's reduced ResNet at batch 16")
    parser.add_argument("--no-check", action="store_true", help="skip the float64 numerics checks")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/conv_bn_fusion.json or /tmp/...)")
    args = parser.parse_args(argv)
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = [p for p in args.precisions if p not in TOLERANCE]
    if unknown:
        parser.error(f"--precisions {','.join(unknown)}: use bf16 and/or tf32")
    return args


def main(argv=None) -> dict:
    from gpuengine.runtime.backend import Backend
    from gpuengine.workloads import resnet
    started, args = time.perf_counter(), parse(argv)
    shape, batch = (resnet.SMOKE_SHAPE, 16) if args.smoke else (resnet.SEED_SHAPE, resnet.TRAIN_BATCH)
    sites = conv_bn_sites(resnet.build_resnet(shape), batch)
    groups = distinct_sites(sites)
    # The most frequent shapes first, so a budget cut loses the least of the step.
    order = sorted(range(len(groups)), key=lambda i: -len(groups[i][1]))[:args.max_sites]
    out = Path(args.out or Path(os.environ.get("OUT", "/tmp")) / "conv_bn_fusion.json")
    backend = Backend("cuda")
    payload = {"environment": environment(), "batch": batch, "convs": len(sites), "distinct_sites": len(groups),
               "launches_per_graph": LAUNCHES, "repeats": REPEATS, "rows": {p: [] for p in args.precisions}}
    log(f"{len(sites)} conv->BN sites, {len(groups)} distinct; {payload['environment']}; JSON -> {out}")
    stopped = False
    for i in order:
        site, names = groups[i]
        for precision in args.precisions:
            if time.perf_counter() - started > args.budget_s:
                stopped = True
                break
            row = probe_site(site, names, precision, backend, not args.no_check)
            row["order"] = i
            payload["rows"][precision].append(row)
            us = " ".join(f"{k} {'-' if v is None else f'{v:.1f}'}" for k, v in row["us"].items())
            log(f"{precision} {row['site']} x{row['multiplicity']}: {us} us; numerics "
                f"{'ok' if row['numerics_ok'] else row['numerics_ok']}")
            for note in row["notes"]:
                log(f"    {note}")
            write_json(out, payload)
        if stopped:
            log(f"budget of {args.budget_s:.0f} s spent: {len(order) - order.index(i)} site shapes not started")
            break
    for precision, rows in payload["rows"].items():
        rows.sort(key=lambda r: r["order"])
        payload.setdefault("estimate", {})[precision] = step_estimate(rows)
        print(format_table(precision, rows, len(sites)), flush=True)
    write_json(out, payload)
    log(f"wrote {out}")
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
