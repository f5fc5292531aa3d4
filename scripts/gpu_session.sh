#!/usr/bin/env bash
# gpu_session.sh: one GPU measuring session, detached from the caller, logs and stored runs in one folder.
#
#   scripts/gpu_session.sh start LOGDIR suite|memory|calibrate|gatepower [ARGS...]
#                                                      start in a session of its own (survives the caller)
#   scripts/gpu_session.sh start LOGDIR steps STEP[=MINUTES] ...
#                                                      the named steps in order, each stopped after its minutes;
#                                                      LOGDIR/baselines_store.tgz holds the store after each step:
#                                                      bring LOGDIR back, not the checkout's store
#   scripts/gpu_session.sh status LOGDIR               the last lines of each log, and whether it finished
#   scripts/gpu_session.sh base REV [DIR]              REV's gpuengine/ and perf_tests/ into DIR (build/base; git-ignored,
#                                                      for `carry`), with REV's commit id in DIR/COMMIT
#
#   suite:     correctness tests (the GPU ones run here), then `./gate perf` (MLP, CNN, energy; stored run autosaved)
#   memory:    `./gate perf -m slow` (the max-batch searches, ~20-30 min)
#   calibrate: `./gate gatepower calibrate ARGS` (noise.json; trials and logs kept in LOGDIR)
#   gatepower: `./gate gatepower ARGS` (the power study; trials and logs kept in LOGDIR)
#   steps:     a device session's plan in one detached job, so no minute is lost between calls; each step's
#              log is LOGDIR/<step>.log and LOGDIR/steps.txt gets "<step> <status> <seconds>" as each ends
#              (status 124: stopped at its minutes, by SIGINT, so pytest's summary is in the log). A failing
#              step does not stop the next; STEP#N runs a step again under its own log (ab ab#2). Steps:
#                kernels  every engine kernel through CuPy (test_gpu_kernels_compile) and NVRTC
#                zoo      depthwise (both ways), GPU zoo tests without the full-size parity, NCCL on one GPU
#                gpu      every GPU correctness test
#                tests    the pytest arguments in TESTS ("correctness_tests/test_gpu_adam.py -k bf16")
#                         split at spaces; TESTS_K, when set, is one -k expression ("layernorm or norm")
#                gpu-api  the GPU correctness tests of attention, the Transformer, prediction and argument checks
#                perf     `./gate perf` (the quick tier; its run is saved by outcome)
#                perf-new `./gate perf` of the workloads never measured on this GPU: zoo, loader, ResNet
#                perf-core `./gate perf` of the MLP and CNN cases: a quick check that a change kept the engine's speed
#                ab       `./gate perf --against build/base` (the quick tier A/B against the checkout carried to
#                         build/base, its commit in build/base/COMMIT: `scripts/gpu_session.sh base REV` makes it);
#                         AB_K, when set, selects its cases (-k); AB_FULL=1 takes the nightly tier's cases (--full);
#                         AB_BASES ("build/base build/alt") runs one A/B session against each folder in turn
#                ab-core  the same for the MLP and CNN cases
#                stack-ab `./gate perf --against-stack build/old.txt --stack-wheels .whl/old`: the tree on the old lock
#                         (build/old.txt, its wheels in .whl/old) against the stack this Python runs (the new lock's
#                         wheels installed by the caller), each side autotuning afresh; STACK_K selects cases (-k)
#                data     the GPU tests of the data path (streamed and resident gathers, memory plans, sharding)
#                perf-streamed `./gate perf --full --against none` of the loader, the zoo's TF32 streamed cases and
#                         ResNet's streamed graph8 case, each streamed case beside the engine on resident data
#                perf-loader `./gate perf --full --against none` of perf_tests/test_loader.py (loader, MLP and CNN streamed)
#                compile  torch_compile_graph's GPU parity tests (compile-parity), then one --full case per workload
#                         beside it (compile-perf)
#                zoo-compile `./gate perf --full --against none` of the zoo's TF32 resident cases (torch_compile_graph)
#                nightly  `./gate perf --full --against none -k SELECTION` for each SELECTION in NIGHTLY_K (';' between
#                         them, one stored run each, so a step stopped at its minutes keeps the runs that ended):
#                         the nightly tier in shares, for a machine held too briefly for all of it
#                slow     `./gate perf -m slow` (the max-batch searches; its run is stored by outcome), of the tests
#                         SLOW_K selects (-k) when set ("train and not pool")
#                profile  `python -m gpuengine profile` of mlp, cnn, resnet (tf32, bf16), transformer and zoo:alexnet,
#                         or of PROFILES when set ("zoo:alexnet --precision tf32;resnet", ';' between profiles);
#                         the Nth, with --against, leaves both sides' profiles and logs in LOGDIR/profile-against/N
#                why      issue 40 once: `profile mlp --against build/base` with the head's steps delayed 50 us (the
#                         power study's injected delay, head only), then an A/B session of the MLP's headline case
#                         against build/base with a 30 us spin planted at the end of the head's steps (in the
#                         session's copy, put back after), which the gate profiles at base and head; its markdown
#                         summary in LOGDIR/summary.md, its run in LOGDIR/why_run.json (nothing stored)
#                bisect-demo `./gate bisect` once on a made history: a copy of the tree as 5 commits, every engine step
#                         made 12 us slower at the 3rd (the MLP's bf16 headline case); LOGDIR/bisect/ keeps its logs
#                study-ab the power study in A/B mode against build/base (A/A at level 0): MLP training and
#                         inference, CNN, Transformer, 3 sessions of 20 s of trials per test
#                study-new the same for ResNet-50, the zoo, the loader and the streamed MLP and CNN
#                faults   the fault trials: out of memory and nan mid-run in a perf session, Ctrl-C in an A/B one
#                calibrate / study   `./gate gatepower calibrate -m gatepower` / the power study
#                autotune the GPU tests of what autotunes (ops/, conv, ResNet, Transformer), four workers
#                plans    `./gate plans` of PLANS (default: resnet transformer cnn mlp zoo:resnet50) in
#                         PLAN_PRECISIONS (default: tf32 bf16): two fresh autotunings compared (plan_stability.json)
#                plan-transfer scripts/cudnn_plan_transfer.py: runtime-compiled plans built in 4 worker processes,
#                         serialised and deserialised here, against building them here (LOGDIR/plan_transfer.json)
#                plan-pool the plan pool (plan_workers): its GPU test, then scripts/setup_time.py of ResNet-50 TF32 with
#                         no kept plans at plan_workers 0, 4 and 8, each in a fresh process (LOGDIR/setup_time.jsonl)
#                determinism `./gate toggle-cost deterministic=0` of TOGGLE_WORKLOADS (default: cnn resnet
#                         transformer zoo:resnet50 zoo:mobilenet_v2), every precision, TOGGLE_ARGS added
#                         ("--length 384 --precision bf16") (LOGDIR/toggle_cost.json)
#                bias-grad bias gradients in the weight-gradient GEMM's epilogue: its GPU tests, then, in fp32, tf32 and
#                         bf16, `./gate toggle-cost bias_grad=sum` of the Transformer (what the default auto's epilogue
#                         gains) and `bias_grad=epilogue` of the CNN (what auto's column sum saves its dense head)
#                         (LOGDIR/toggle_cost_bias_grad_{sum,epilogue}.json)
#                bn-engine the engine's own batch norm (batchnorm=engine): its GPU tests, each named as it ends
#                         (-v; BN_TESTS=0 leaves them to a tests step), then `./gate toggle-cost batchnorm=BN_TOGGLE`
#                         (default engine; auto: by the map's rows) of BN_WORKLOADS (default: resnet zoo:resnet50
#                         zoo:mobilenet_v2) in BN_PRECISIONS (tf32 bf16) (LOGDIR/toggle_cost_batchnorm.json)
#                bn-layers scripts/bn_layers.py: every batch norm of BN_LAYER_WORKLOAD (default resnet) timed alone in
#                         BN_PRECISION (default bf16), cuDNN's graphs against the engine's kernels as planned and on
#                         the ticket's ending alone, with each layer's cluster sizes (LOGDIR/bn_layers.json)
#                bn-tiles the engine's batch-norm plans by tile width: bn_layers.py of BN_LAYER_WORKLOAD (resnet) in
#                         each of BN_PRECISIONS (bf16 tf32), cuDNN's graphs once, then the engine under each of BN_TILES
#                         ("timed 1 2 4 1-8 4-8 8-8": timed, each layer's plan kept by timing as a trainer does;
#                         --narrowest N, or N-W with --widest W; LOGDIR/bn_tiles_<p>_<tiles>.json)
#                bn-cold  bn_layers.py of BN_LAYER_WORKLOAD (resnet) in each of BN_PRECISIONS (bf16 tf32), every call
#                         after an L2 flush (--cold): cuDNN's graphs and the engine's kernels
#                         (LOGDIR/bn_cold_<p>_<cudnn|engine>.json), as a step's calls find their inputs in device memory
#                bn-early the engine's batch norm launched early (ops/batchnorm.py LAUNCH_EARLY): its GPU tests, then
#                         `./gate toggle-cost batchnorm=engine` of BN_WORKLOADS (resnet) in BN_PRECISIONS (bf16 tf32)
#                         (7 rounds) with LAUNCH_EARLY False, True, False, True (set in the session's copy, put back;
#                         LOGDIR/toggle_cost_bn_early_<n>_<False|True>.json), then a profile of ResNet bf16 with the
#                         engine's batch norm each way (LOGDIR/profiles_<False|True>/)
#                narrow   Adam reading the bf16 weight gradients in their scratches (trainer.READ_NARROW_GRADIENTS):
#                         its GPU tests, then profiles of NARROW_PROFILE (default: resnet --precision bf16
#                         --cuda-graph 8) with it False, True, False, True (set in the session's copy, put back;
#                         LOGDIR/narrow_<n>_<False|True>/, on copies of the kept plans): the timed step, Adam's
#                         and the widening's kernels
#                gaps     the engine's gaps between kernels, machine by machine (the bf16 ResNet step with its
#                         batch norm profiled at 2,309-2,372 us with 46 us of gaps on one H200, 2,422 with 159 on
#                         another): the machine's CPU and clocks, then profiles of resnet bf16 graph8 batchnorm=engine
#                         on the kept plans, alone, with the references, alone again (LOGDIR/gaps_<n>_<side>/), then
#                         `./gate toggle-cost batchnorm=engine resnet --precision bf16` (7 rounds): its rounds of
#                         8 steps, each timed alone, against the profiles' bursts
#                round-gaps scripts/round_gaps.py of ResNet-50 in each of ROUND_PRECISIONS (default: bf16): epochs
#                         of 50, 48 and 8 steps with torch_graph's rounds between the engine's, then 50 alone, then
#                         50 alone off the timing core: where the engine's rounds lose 140-160 us a step against its
#                         profile's bursts (LOGDIR/round_gaps_<p>.json, round_gaps_<p>_alone[_unpinned].json)
#                residue  what a process's earlier work leaves that slows the engine's replays (round-gaps found the
#                         rounds' replays themselves 115 us a step slower in a process that autotuned its plans):
#                         scripts/residue.py of ResNet-50 bf16 on the kept plans, timed after each phase (modules
#                         loaded, memory held and released, another engine autotuned, then dropped, torch_graph
#                         built); then the engine autotuned afresh in its own process, and on the kept plans with
#                         CUDA_MODULE_LOADING=EAGER (LOGDIR/residue_<n>.json)
#                ncu-bn   Nsight Compute over the engine's batch-norm kernels (bn_forward, bn_backward) of NCU_BN_LAYERS
#                         (a regular expression of ResNet's layer names; default: one of each map size) in
#                         BN_PRECISION (default bf16), one timed call each (bn_layers.py --reps 1): speed of light,
#                         occupancy, warp stalls and memory, where their time goes (ncu --clock-control none;
#                         only the timed replays, between bn_layers' cudaProfilerStart and Stop: not the autotuning)
#                dp       issue 39 on 2 GPUs: `launch --gpus 2 mlp` with and without CUDA graphs, in build/base and the
#                         tree (DP_TREES), each rank's stacks printed when it stalls (45 s a stage) or the launcher stops
#                         it (100 s), NCCL_DEBUG=WARN; then the parallel GPU tests (-v)
#                perf-cold `./gate perf --against none` with no kept plans (cudnn_plans.json removed): a new user's
#                         first run on a fresh machine, each test against its stored baseline, autotuning included;
#                         COLD_K, when set, selects its cases (-k)
#                ab-cold  the step ab with no kept plans (cudnn_plans.json removed): a fresh machine's first run,
#                         autotuning included (with build/base at the same commit: the cold A/A run)
#
# For machines whose commands are cut off after a few minutes (a lent GPU): start, then poll `status`
# from calls that wait (`sleep 540; ... status`) back to back: a lent machine idle between calls goes back,
# with its detached job and logs, after its idle time (30 s): a running job does not keep it.
# The session runs in LOGDIR.tree, a copy of the checkout made at start (build/base and .whl included).
# Needs the engine's packages importable already (GATE_NO_INSTALL=1 is set: no package registry assumed).
# GATE_COMMIT_ID names the commit in the stored run when the tree has no .git.
set -uo pipefail
cd "$(dirname "$0")/.."

command=${1:-}
logdir=${2:-}
[ -n "$command" ] && [ -n "$logdir" ] || { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }

run_suite() {
    python3 -m pytest correctness_tests -q -p no:cacheprovider -rs 2>&1 | tee "$logdir/correctness.log"
    ./gate perf -p no:cacheprovider 2>&1 | tee "$logdir/perf.log"
}

run_memory() {
    ./gate perf -p no:cacheprovider -m slow -s 2>&1 | tee "$logdir/memory.log"
}

run_calibrate() {
    ./gate gatepower calibrate --keep-trials "$logdir/trials" "$@" 2>&1 | tee "$logdir/calibrate.log"
}

run_gatepower() {
    ./gate gatepower --keep-trials "$logdir/trials" "$@" 2>&1 | tee "$logdir/gatepower.log"
}

step_kernels() { python3 -m pytest correctness_tests/runtime/test_gpu_kernels_compile.py correctness_tests/runtime/test_kernels_compile.py \
    -q -p no:cacheprovider -rs; }
step_zoo() { python3 -m pytest correctness_tests/ops/test_gpu_depthwise.py correctness_tests/workloads/test_gpu_zoo.py \
    correctness_tests/parallel/test_nccl_one_gpu.py -k "not full_size" -q -p no:cacheprovider -rs --durations=15; }
step_tests() { python3 -m pytest ${TESTS:?TESTS names the tests} ${TESTS_K:+-k "$TESTS_K"} -q -p no:cacheprovider -rs \
    --durations=10; }
# four workers share the GPU (447 tests in 15 min on an H100 at 8f8a6d7, a single process was cut at 438)
step_gpu() { python3 -m pytest correctness_tests -m gpu -n 4 --dist loadfile -q -p no:cacheprovider -rfEs --durations=15; }
step_gpu-api() { python3 -m pytest correctness_tests -m gpu -k "attention or transformer or predict or embedding or checks" \
    -q -p no:cacheprovider -rs --durations=10; }
step_data() { python3 -m pytest correctness_tests -m gpu -k "loader or streamed or memory_plan or gather or sharding" \
    -q -p no:cacheprovider -rs --durations=10; }
step_perf-streamed() { ./gate perf -p no:cacheprovider --durations=0 -rA --full --against none \
    -k "test_loader or (test_zoo and tf32-streamed) or (test_resnet and graph8-streamed)"; }
step_perf-loader() { ./gate perf -p no:cacheprovider --durations=0 -rA --full --against none \
    -k "test_loader_bandwidth or test_mlp_streamed or test_cnn_streamed"; }
step_compile() { step_compile-parity; step_compile-perf; }
step_compile-parity() { python3 -m pytest correctness_tests/reference/test_torch_compile_graph.py \
    correctness_tests/reference/test_torch_references.py -k gpu -q -p no:cacheprovider -rs --durations=10; }
step_compile-perf() { ./gate perf -p no:cacheprovider --durations=0 -rA --full --against none -k "test_mlp_train[tf32-graph8-resident-bpe1] \
    or test_mlp_infer[tf32-resident-b8000] or test_mlp_infer[tf32-resident-b512] or test_cnn_train[tf32-graph8-resident-b128] \
    or test_resnet_train[cifar10-tf32-graph8-resident-b128] or test_resnet_train[cifar10-bf16-graph8-resident-b128] \
    or test_transformer_train[seq128-tf32-graph8-b16] or test_zoo_train[alexnet-tf32-resident-b16]"; }
step_profile() { local w s=0 n=0 IFS=';'; for w in ${PROFILES:-mlp --precision tf32;cnn --precision tf32;resnet \
    --precision tf32;resnet --precision bf16;transformer --precision tf32;zoo:alexnet --precision tf32}; do
    echo "== profile $w"; rm -rf build/profile-against; IFS=' ' eval "python3 -m gpuengine profile $w" || s=1
    # --against keeps both sides' profiles in the tree, which the caller does not bring back: copy them out
    n=$((n + 1)); if [ -d build/profile-against ]; then mkdir -p "$logdir/profile-against/$n" && \
        cp -r build/profile-against/. "$logdir/profile-against/$n/"; fi; done; return $s; }
step_why() { local s=0 f=gpuengine/bench/injected_delay.py
    echo "== profile mlp --against build/base, the head's steps delayed 50 us (the power study's injected delay)"
    GATEPOWER_STUDY="$logdir/why-study" GATEPOWER_INJECT_DELAY_US=50 python3 -m gpuengine profile mlp \
        --precision tf32 --cuda-graph 8 --against build/base || s=1
    echo "== A/B against build/base, a 30 us spin planted at the end of the head's steps: the gate profiles both"
    cp "$f" "$logdir/injected_delay.py.orig"
    python3 -c "import sys; p = sys.argv[1]; t = open(p).read(); old = '    delay = for_backend(get_backend(config))\n'
assert old in t
open(p, 'w').write(t.replace(old, '    delay = StepDelay(get_backend(config), 30.0) if get_backend(config).is_gpu else '
                                  'for_backend(get_backend(config))\n'))" "$f" || return 1
    GITHUB_STEP_SUMMARY="$logdir/step_summary.md" python3 -m pytest perf_tests -m "not slow" -p no:cacheprovider -rA \
        --benchmark-compare --benchmark-json="$logdir/why_run.json" --gate-summary "$logdir/summary.md" \
        --against build/base -k "test_mlp.py and test_mlp_train[tf32-graph8-resident-bpe1]"
    [ $? -le 1 ] || s=1   # 1: the planted regression failed the test, as it should
    cp "$logdir/injected_delay.py.orig" "$f"
    return $s; }
step_bisect-demo() { local repo="$logdir/bisect-repo" s=0   # a history of 4 commits, 12 us a step planted at the 2nd
    rm -rf "$repo" && mkdir -p "$repo" && cp -a . "$repo/" && rm -rf "$repo/.git" "$repo/build" || return 1
    ( cd "$repo" && export GIT_AUTHOR_NAME=gate GIT_AUTHOR_EMAIL=gate@localhost GIT_COMMITTER_NAME=gate \
        GIT_COMMITTER_EMAIL=gate@localhost
      git init -q -b main && git add -A && git commit -qm "GOOD: the tree as carried"
      echo one >> NOTES.md && git add NOTES.md && git commit -qm "notes: one"
      printf '\n\ndef step_hook(config):   # planted: every engine step waits 12 us, armed or not\n    return StepDelay(get_backend(config), 12).wait\n' >> gpuengine/bench/injected_delay.py
      git commit -qam "plant: every engine step waits 12 us"
      echo two >> NOTES.md && git commit -qam "notes: two"
      echo three >> NOTES.md && git commit -qam "notes: three"
      ./gate bisect HEAD~4 HEAD -k "test_mlp_train and bf16-graph8-resident-bpe1 and not bpe12" ) || s=$?
    cp -r "$repo/build/bisect" "$logdir/bisect" 2>/dev/null; return $s; }
step_perf() { ./gate perf -p no:cacheprovider --durations=0; }
step_perf-core() { ./gate perf -p no:cacheprovider --durations=0 -k "test_mlp_train or test_mlp_infer or test_cnn_train"; }
step_perf-new() { ./gate perf -p no:cacheprovider --durations=0 -k "zoo or loader or streamed or test_resnet_train"; }
step_ab() { local base s=0
    for base in ${AB_BASES:-build/base}; do
        echo "== A/B against $base ($(cat "$base/COMMIT" 2>/dev/null))"
        ./gate perf -p no:cacheprovider --durations=0 -rA --against "$base" ${AB_FULL:+--full} ${AB_K:+-k "$AB_K"} || s=1
        cp -r build/ab "$logdir/ab-logs-$(date +%s)" 2>/dev/null
    done; return $s; }
step_zoo-compile() { ./gate perf -p no:cacheprovider --durations=0 -rA --full --against none \
    -k "test_zoo_train and tf32-resident"; }
step_nightly() { local k s=0 IFS=';'; for k in ${NIGHTLY_K:?NIGHTLY_K selects the nightly cases}; do
    echo "== nightly -k $k"; ./gate perf -p no:cacheprovider --durations=0 -rA --full --against none -k "$k" || s=1
    done; return $s; }
step_slow() { ./gate perf -p no:cacheprovider --durations=0 -rA -m slow ${SLOW_K:+-k "$SLOW_K"}; }
step_stack-ab() { local s; ./gate perf -p no:cacheprovider --durations=0 -rA --against-stack build/old.txt \
    --stack-wheels .whl/old ${STACK_K:+-k "$STACK_K"}; s=$?; cp -r build/ab "$logdir/stack-ab-logs" 2>/dev/null; return $s; }
step_ab-core() { local s; ./gate perf -p no:cacheprovider --durations=0 -rA --against build/base \
    -k "test_mlp_train or test_mlp_infer or test_cnn_train"; s=$?; cp -r build/ab "$logdir/ab-logs" 2>/dev/null; return $s; }
step_study-ab() { ./gate gatepower --against build/base --sessions 3 --trial-budget 20 \
    -k "test_mlp_train or test_mlp_infer or test_cnn_train or test_transformer_train" \
    --keep-trials "$logdir/trials-study-ab"; local s=$?
    tar czf "$logdir/trials-study-ab.tgz" -C "$logdir" trials-study-ab; return $s; }
step_study-new() { ./gate gatepower --against build/base --sessions 3 --trial-budget 20 \
    -k "test_resnet_train or test_zoo_train or test_loader_bandwidth or test_mlp_streamed or test_cnn_streamed" \
    --keep-trials "$logdir/trials-study-new"; local s=$?
    tar czf "$logdir/trials-study-new.tgz" -C "$logdir" trials-study-new; return $s; }
step_faults() { python3 -m pytest correctness_tests/faults correctness_tests/test_trainer.py correctness_tests/gate/test_ab_smoke.py \
    -k "faults or nan or ctrl_c" -q -p no:cacheprovider -rA; }
step_autotune() { python3 -m pytest correctness_tests/ops correctness_tests/layers/test_gpu_conv.py \
    correctness_tests/workloads/test_gpu_resnet.py correctness_tests/workloads/test_gpu_transformer.py -m gpu -n 4 \
    --dist loadfile -q -p no:cacheprovider -rs --durations=15; }
step_plans() { ./gate plans ${PLANS:-resnet transformer cnn mlp zoo:resnet50} \
    --precision ${PLAN_PRECISIONS:-tf32 bf16} --out "$logdir/plan_stability.json"; }
step_plan-transfer() { python3 scripts/cudnn_plan_transfer.py --workers 4 > "$logdir/plan_transfer.json"; }
step_plan-pool() { local n s=0
    python3 -m pytest correctness_tests/ops/test_gpu_plan_pool.py -q -p no:cacheprovider -rfE || s=1
    for n in 0 4 8; do python3 scripts/setup_time.py resnet --precision tf32 --toggle plan_workers=$n \
        >> "$logdir/setup_time.jsonl" || s=1; done; return $s; }
step_determinism() { ./gate toggle-cost deterministic=0 \
    ${TOGGLE_WORKLOADS:-cnn resnet transformer zoo:resnet50 zoo:mobilenet_v2} $TOGGLE_ARGS --out "$logdir/toggle_cost.json"; }
step_bn-engine() { local s=0
    if [ "${BN_TESTS:-1}" = 1 ]; then python3 -m pytest correctness_tests/layers/test_gpu_batchnorm_engine.py -n 4 -v \
        -p no:cacheprovider -rfE --durations=5 || s=1; fi
    ./gate toggle-cost batchnorm=${BN_TOGGLE:-engine} ${BN_WORKLOADS:-resnet zoo:resnet50 zoo:mobilenet_v2} \
        --precision ${BN_PRECISIONS:-tf32 bf16} --rounds 11 --out "$logdir/toggle_cost_batchnorm.json" || s=1
    return $s; }
step_bias-grad() { local s=0
    python3 -m pytest correctness_tests/layers/test_gpu_bias_grad.py correctness_tests/ops/test_gpu_gemm.py -n 4 -v \
        -p no:cacheprovider -rfE --durations=5 || s=1
    ./gate toggle-cost bias_grad=sum transformer --precision fp32 tf32 bf16 \
        --rounds 11 --out "$logdir/toggle_cost_bias_grad_sum.json" || s=1
    ./gate toggle-cost bias_grad=epilogue cnn --precision fp32 tf32 bf16 \
        --rounds 11 --out "$logdir/toggle_cost_bias_grad_epilogue.json" || s=1
    return $s; }
step_bn-layers() { python3 scripts/bn_layers.py ${BN_LAYER_WORKLOAD:-resnet} --precision ${BN_PRECISION:-bf16} \
    --out "$logdir/bn_layers.json"; }
step_bn-tiles() { local p tiles narrowest widest s=0
    for p in ${BN_PRECISIONS:-bf16 tf32}; do
        python3 scripts/bn_layers.py "${BN_LAYER_WORKLOAD:-resnet}" --precision "$p" --batchnorm cudnn \
            --out "$logdir/bn_tiles_${p}_cudnn.json" || s=1
        for tiles in ${BN_TILES:-timed 1 2 4 1-8 4-8 8-8}; do
            narrowest=${tiles%%-*} widest=${tiles#*-}
            [ "$widest" != "$tiles" ] || widest=""   # "N": no --widest
            [ "$tiles" != timed ] || narrowest=""    # each layer's plan timed and kept
            echo "== $p, tiles of ${narrowest:-timed} to ${widest:-32 channels} packs"
            python3 scripts/bn_layers.py "${BN_LAYER_WORKLOAD:-resnet}" --precision "$p" --batchnorm engine \
                ${narrowest:+--narrowest "$narrowest"} ${widest:+--widest "$widest"} \
                --out "$logdir/bn_tiles_${p}_$tiles.json" || s=1
        done
    done
    return $s; }
step_bn-cold() { local p side s=0
    for p in ${BN_PRECISIONS:-bf16 tf32}; do for side in cudnn engine; do
        python3 scripts/bn_layers.py "${BN_LAYER_WORKLOAD:-resnet}" --precision "$p" --batchnorm "$side" --cold \
            --out "$logdir/bn_cold_${p}_$side.json" || s=1
    done; done
    return $s; }
# A module constant set in the session's copy (its original kept in LOGDIR/<file>.orig, put back by the caller):
# set_constant FILE NAME VALUE; on a failed edit the original is put back and the status is 1.
set_constant() { local orig="$logdir/$(basename "$1").orig"
    [ -f "$orig" ] || cp "$1" "$orig" || return 1
    sed -i "s/^$2 = .*/$2 = $3/" "$1" && grep -q "^$2 = $3\$" "$1" || { cp "$orig" "$1"; return 1; }; }
step_bn-early() { local s=0 f=gpuengine/ops/batchnorm.py early n=0
    python3 -m pytest correctness_tests/layers/test_gpu_batchnorm_engine.py -n 4 -v -p no:cacheprovider -rfE \
        -k "early" || s=1
    for early in False True False True; do   # alternated: a drift of the machine shows as a difference of the pairs
        n=$((n + 1))
        set_constant "$f" LAUNCH_EARLY $early || return 1
        ./gate toggle-cost batchnorm=engine ${BN_WORKLOADS:-resnet} --precision ${BN_PRECISIONS:-bf16 tf32} \
            --rounds 7 --out "$logdir/toggle_cost_bn_early_${n}_$early.json" || s=1
        [ $n -gt 2 ] || python3 -m gpuengine profile resnet --precision bf16 --cuda-graph 8 --toggle batchnorm=engine \
            --references --store "$logdir/profiles_$early" || s=1
    done
    cp "$logdir/batchnorm.py.orig" "$f"
    return $s; }
step_narrow() { local s=0 f=gpuengine/trainer.py narrow n=0 store
    python3 -m pytest correctness_tests/test_gpu_adam.py -v -p no:cacheprovider -rfE || s=1
    for narrow in False True False True; do   # alternated: a drift of the machine shows as a difference of the pairs
        n=$((n + 1))
        set_constant "$f" READ_NARROW_GRADIENTS $narrow || return 1
        store="$logdir/narrow_${n}_$narrow"
        mkdir -p "$store" && (cd baselines_store && cp --parents */cudnn_plans.json "$store/") || s=1   # kept plans
        python3 -m gpuengine profile ${NARROW_PROFILE:-resnet --precision bf16 --cuda-graph 8} --references \
            --store "$store" || s=1   # --references alone: the engine alone
    done
    cp "$logdir/trainer.py.orig" "$f"
    return $s; }
step_gaps() { local n=0 side store s=0
    lscpu | grep -E "^(Model name|CPU\(s\)|CPU max MHz|NUMA node\(s\))"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,pstate --format=csv
    for side in alone references alone; do
        n=$((n + 1)) store="$logdir/gaps_${n}_$side"
        mkdir -p "$store" && (cd baselines_store && cp --parents */cudnn_plans.json "$store/") || s=1   # kept plans
        python3 -m gpuengine profile resnet --precision bf16 --cuda-graph 8 --toggle batchnorm=engine \
            $([ "$side" = alone ] && echo --references) --store "$store" || s=1
    done
    ./gate toggle-cost batchnorm=engine resnet --precision bf16 --rounds 7 --out "$logdir/toggle_cost_gaps.json" || s=1
    return $s; }
step_round-gaps() { local p s=0
    for p in ${ROUND_PRECISIONS:-bf16}; do
        python3 scripts/round_gaps.py resnet --precision "$p" --references --out "$logdir/round_gaps_$p.json" || s=1
        python3 scripts/round_gaps.py resnet --precision "$p" --epoch 50 --out "$logdir/round_gaps_${p}_alone.json" || s=1
        python3 scripts/round_gaps.py resnet --precision "$p" --epoch 50 --no-pin \
            --out "$logdir/round_gaps_${p}_alone_unpinned.json" || s=1
    done
    return $s; }
step_residue() { local s=0
    python3 scripts/residue.py resnet --precision bf16 --out "$logdir/residue_1_phases.json" || s=1
    python3 scripts/residue.py resnet --precision bf16 --store "$logdir/no_plans" --phases kept,modules,again \
        --out "$logdir/residue_2_fresh.json" || s=1   # no kept plans there: autotuned in this process
    CUDA_MODULE_LOADING=EAGER python3 scripts/residue.py resnet --precision bf16 \
        --phases kept,autotuned,dropped,again --out "$logdir/residue_3_eager.json" || s=1
    return $s; }
step_ncu-bn() { local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    [ -n "$ncu" ] || { echo "ncu-bn: no ncu on this machine"; return 1; }
    "$ncu" --clock-control none --profile-from-start off -k 'regex:^bn_(forward|backward)$' \
        --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 scripts/bn_layers.py resnet --precision "${BN_PRECISION:-bf16}" --batchnorm engine --reps 1 \
        --only "${NCU_BN_LAYERS:-^(bn1|layer1\.0\.bn3|layer2\.0\.bn3|layer3\.0\.bn3|layer4\.0\.bn3)$}"; }
step_dp() { local diag="$logdir/dp-diag" where graph s=0   # SIGTERM (the launcher's --timeout) prints each rank's stacks
    mkdir -p "$diag" && printf 'import faulthandler, signal\nfaulthandler.register(signal.SIGTERM, all_threads=True, chain=True)\n' \
        > "$diag/sitecustomize.py" || return 1
    for where in ${DP_TREES:-build/base .}; do for graph in 4 0; do
        echo "== launch --gpus 2 mlp in $where ($(cat "$where/COMMIT" 2>/dev/null || echo "the tree, ${GATE_COMMIT_ID:-}")), \
            GPUENGINE_CUDA_GRAPH=$graph"
        ( cd "$where" && PYTHONPATH="$diag${PYTHONPATH:+:$PYTHONPATH}" GPUENGINE_DEVICE=cuda GPUENGINE_PRECISION=fp32 \
            GPUENGINE_CUDA_GRAPH=$graph NCCL_DEBUG=WARN timeout -s INT 150 python3 -m gpuengine.parallel.launch --gpus 2 \
            --timeout 100 --grace 5 mlp --bucket-bytes 600 --stall-limit 45 --samples 512 --batch 64 --epochs 3 )
        echo "== exit status $?"
    done; done
    python3 -m pytest correctness_tests/parallel -m gpu -v -p no:cacheprovider -rs --durations=10 || s=1
    return $s; }
step_perf-cold() { rm -f baselines_store/*/cudnn_plans.json
    ./gate perf -p no:cacheprovider --durations=0 -rA --against none ${COLD_K:+-k "$COLD_K"}; }
step_ab-cold() { rm -f baselines_store/*/cudnn_plans.json; step_ab; }
step_calibrate() { ./gate gatepower calibrate -m gatepower --keep-trials "$logdir/trials-calibrate"; }
step_study() { ./gate gatepower --keep-trials "$logdir/trials-study"; }

# The store as a tarball in the log folder, written aside and renamed: a poll that finds `done` (written after
# the last one) or copies the folder mid-step never takes half a tarball.
store_snapshot() { tar czf "$logdir/baselines_store.tgz.part" baselines_store && \
    mv "$logdir/baselines_store.tgz.part" "$logdir/baselines_store.tgz"; }

run_steps() {
    local spec step name minutes began status
    for spec in "$@"; do
        step=${spec%%=*}; minutes=${spec#*=}; [ "$minutes" = "$spec" ] && minutes=10
        name=${step%%#*}   # ab#2: the step ab again, logged as ab#2.log
        began=$(date +%s)
        echo "== step $step (at most $minutes min) at $(date -u +%H:%M:%S)"
        # SIGINT, not SIGTERM: pytest then prints its summary, so a step stopped at its minutes still names its failures
        timeout -s INT --kill-after=30 "${minutes}m" bash -c "$(declare -f); logdir='$logdir'; step_$name" \
            > "$logdir/$step.log" 2>&1 < /dev/null
        status=$?
        echo "$step $status $(( $(date +%s) - began ))" | tee -a "$logdir/steps.txt"
        store_snapshot   # the runs so far, in the log folder, step by step
    done
}

case "$command" in
    start)
        what=${3:-}
        case "$what" in suite|memory|calibrate|gatepower|steps) ;;
            *) echo "gpu_session: suite, memory, calibrate, gatepower or steps, not '$what'" >&2; exit 2 ;;
        esac
        if [ "$what" = steps ]; then
            [ $# -ge 4 ] || { echo "gpu_session: steps needs at least one STEP[=MINUTES]" >&2; exit 2; }
            for spec in "${@:4}"; do
                spec=${spec%%=*}
                declare -F "step_${spec%%#*}" > /dev/null \
                    || { echo "gpu_session: no step '${spec%%#*}' (see the usage: $0)" >&2; exit 2; }
            done
        fi
        args=""
        [ $# -lt 4 ] || args=$(printf '%q ' "${@:4}")   # printf with no arguments would pass one empty one
        logdir=$(realpath -m -- "$logdir")   # the session runs elsewhere (below)
        mkdir -p "$logdir"
        rm -f "$logdir/done"
        # The session runs in a copy of the checkout: the device tool re-syncs the checkout at every call, which
        # deleted a stored run written between a poll's start and the step's snapshot of the store.
        rm -rf "$logdir.tree" && cp -a . "$logdir.tree" && cd "$logdir.tree" || exit 1
        export GATE_NO_INSTALL=1 PYTHONUNBUFFERED=1
        setsid bash -c "set -o pipefail; $(declare -f run_suite run_memory run_calibrate run_gatepower run_steps \
            store_snapshot set_constant $(compgen -A function step_)); \
            logdir='$logdir'; run_$what $args; \
            status=\$?; store_snapshot; echo \$status > '$logdir/done'" \
            > "$logdir/session.log" 2>&1 < /dev/null &
        echo "started $what (pid $!), logs in $logdir"
        ;;
    base)
        rev=$(git rev-parse --verify "$logdir^{commit}") || exit 2   # the second word is REV here
        dir=${3:-build/base}
        case $dir in build/*) ;; *) echo "gpu_session base: $dir is not under build/ (git-ignored)" >&2; exit 2 ;; esac
        rm -rf "$dir" && mkdir -p "$dir"
        git archive "$rev" gpuengine perf_tests | tar -x -C "$dir"
        echo "$rev" > "$dir/COMMIT"
        echo "$dir: gpuengine/ and perf_tests/ of $rev"
        ;;
    status)
        for log in "$logdir"/*.log; do
            [ -f "$log" ] && { echo "== $log"; tail -n 15 "$log"; }
        done
        if [ -f "$logdir/done" ]; then echo "finished, status $(cat "$logdir/done")"; else echo "running"; fi
        ;;
    *)
        echo "gpu_session: start or status, not '$command'" >&2
        exit 2
        ;;
esac
