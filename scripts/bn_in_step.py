"""Each batch norm's launch inside the whole training step beside the same layer timed alone (issue 38's lever):
whose batch norm, the engine's or cuDNN's, costs more in the step than by itself, and where.

    python3 scripts/bn_in_step.py PROFILE.json BN_LAYERS.json [--out FILE]

PROFILE.json is a kernel profile of a workload (`python -m gpuengine profile resnet ...`, with its kernels'
launch_us); BN_LAYERS.json is scripts/bn_layers.py's --out for the same workload and precision, holding the
profile's side (the engine's kernels where the profile toggled batchnorm=engine, else cuDNN's graphs). The
forward kernels launch in the layers' order and the backward ones in the reverse order, once a layer:
bn_forward and bn_backward for the engine, nhwc_batch_norm_fwd and nhwc_batch_norm_bwd for cuDNN. Prints a
table by layer (alone, in the step, the difference) and the totals, and with --out writes them as JSON; exit
status 2 where the files do not pair (another workload or precision, a side bn_layers did not time, launches
that are not one a layer).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KERNELS = {"engine": ("bn_forward", "bn_backward"), "cudnn": ("nhwc_batch_norm_fwd", "nhwc_batch_norm_bwd")}


class Unpaired(ValueError):
    """The profile and the layers' times are not of one workload and side."""


def _launches(runner: dict, name: str, layers: int) -> list[float]:
    kernel = next((k for k in runner.get("kernels", []) if k.get("name") == name), None)
    launches = (kernel or {}).get("launch_us")
    if launches is None:
        raise Unpaired(f"the profile has no launch_us of {name} (a profile from before it was recorded, or a kernel "
                       "launched unevenly between replays)")
    if len(launches) != layers:
        raise Unpaired(f"{name} launches {len(launches)} times a step where bn_layers timed {layers} layers")
    return launches


def pair(profile: dict, layers: dict, runner: str = "gpuengine") -> dict:
    """{"side", "layers": [{layer, shape, forward/backward alone and in the step}], "totals"}; Unpaired if the two
    files do not describe one workload, precision and side."""
    toggles = profile.get("toggles", {})
    if (profile.get("workload"), toggles.get("precision")) != (layers.get("workload"), layers.get("precision")):
        raise Unpaired(f"the profile is of {profile.get('workload')} {toggles.get('precision')}, the layers' times "
                       f"of {layers.get('workload')} {layers.get('precision')}")
    side = "engine" if toggles.get("batchnorm") == "engine" else "cudnn"
    rows = layers.get("layers", [])
    if not rows or f"{side}_forward_us" not in rows[0]:
        raise Unpaired(f"bn_layers timed no {side} side (its --batchnorm); the profile's batch norm is {side}'s")
    forward, backward = KERNELS[side]
    runners = profile.get("runners") or profile.get("sides") or {}
    if runner not in runners:
        raise Unpaired(f"the profile has no runner {runner!r} (it has {', '.join(runners) or 'none'})")
    fwd = _launches(runners[runner], forward, len(rows))
    bwd = _launches(runners[runner], backward, len(rows))[::-1]   # the backward pass meets the layers last first
    paired = [{"layer": row["layer"], "shape": row["shape"],
               "forward_alone_us": row[f"{side}_forward_us"], "forward_step_us": fwd[i],
               "backward_alone_us": row[f"{side}_backward_us"], "backward_step_us": bwd[i]}
              for i, row in enumerate(rows)]
    totals = {key: round(sum(row[key] for row in paired), 1) for key in
              ("forward_alone_us", "forward_step_us", "backward_alone_us", "backward_step_us")}
    return {"side": side, "cold": bool(layers.get("cold")), "layers": paired, "totals": totals}


def table(result: dict) -> str:
    alone = "alone after an L2 flush" if result.get("cold") else "alone, L2 warm"
    lines = [f"{result['side']}'s batch norm, us a call: {alone} (bn_layers) and in the step (the profile)",
             f"{'layer':<28} {'shape':<18} {'fwd alone':>10} {'in step':>9} {'+':>7} {'bwd alone':>10} "
             f"{'in step':>9} {'+':>7}"]
    for row in result["layers"] + [{"layer": "total", "shape": "", **result["totals"]}]:
        shape = "x".join(map(str, row["shape"])) if row["shape"] else ""
        lines.append(f"{row['layer']:<28} {shape:<18} {row['forward_alone_us']:>10.1f} {row['forward_step_us']:>9.1f} "
                     f"{row['forward_step_us'] - row['forward_alone_us']:>+7.1f} {row['backward_alone_us']:>10.1f} "
                     f"{row['backward_step_us']:>9.1f} {row['backward_step_us'] - row['backward_alone_us']:>+7.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from gpuengine.bench.json_files import write_json
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("layers", type=Path)
    parser.add_argument("--runner", default="gpuengine", help="the profile's runner (default: the engine)")
    parser.add_argument("--out", type=Path, help="also write the pairs as JSON here (written aside, renamed)")
    args = parser.parse_args(argv)
    try:
        loaded = [json.loads(path.read_text()) for path in (args.profile, args.layers)]
        result = pair(*loaded, runner=args.runner)
    except (OSError, ValueError) as error:   # json.JSONDecodeError and Unpaired are ValueErrors
        print(f"bn_in_step: {error}", file=sys.stderr)
        return 2
    print(table(result))
    if args.out is not None:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
