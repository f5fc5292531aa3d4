#!/usr/bin/env bash
# gpu_session.sh: one GPU measuring session, detached from the caller, logs and stored runs in one folder.
#
#   scripts/gpu_session.sh start LOGDIR suite|memory|calibrate|gatepower [ARGS...]
#                                                      start in a session of its own (survives the caller)
#   scripts/gpu_session.sh status LOGDIR               the last lines of each log, and whether it finished
#
#   suite:     correctness tests (the GPU ones run here), then `./gate perf` (MLP, CNN, energy; stored run autosaved)
#   memory:    `./gate perf -m slow` (the max-batch searches, ~20-30 min)
#   calibrate: `python -m gpuengine gatepower calibrate ARGS` (noise.json; trials and logs kept in LOGDIR)
#   gatepower: `python -m gpuengine gatepower ARGS` (the power study; trials and logs kept in LOGDIR)
#
# For machines whose commands are cut off after a few minutes (a lent GPU): start, then poll `status`.
# Needs the engine's packages importable already (GATE_NO_INSTALL=1 is set: no package registry assumed).
# GATE_COMMIT_ID names the commit in the stored run when the tree has no .git.
set -uo pipefail
cd "$(dirname "$0")/.."

command=${1:-}
logdir=${2:-}
[ -n "$command" ] && [ -n "$logdir" ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

run_suite() {
    python3 -m pytest correctness_tests -q -p no:cacheprovider -rs 2>&1 | tee "$logdir/correctness.log"
    ./gate perf -p no:cacheprovider 2>&1 | tee "$logdir/perf.log"
}

run_memory() {
    ./gate perf -p no:cacheprovider -m slow -s 2>&1 | tee "$logdir/memory.log"
}

run_calibrate() {
    python3 -m gpuengine gatepower calibrate --keep-trials "$logdir/trials" "$@" 2>&1 | tee "$logdir/calibrate.log"
}

run_gatepower() {
    python3 -m gpuengine gatepower --keep-trials "$logdir/trials" "$@" 2>&1 | tee "$logdir/gatepower.log"
}

case "$command" in
    start)
        what=${3:-}
        case "$what" in suite|memory|calibrate|gatepower) ;;
            *) echo "gpu_session: suite, memory, calibrate or gatepower, not '$what'" >&2; exit 2 ;;
        esac
        args=""
        [ $# -lt 4 ] || args=$(printf '%q ' "${@:4}")   # printf with no arguments would pass one empty one
        mkdir -p "$logdir"
        rm -f "$logdir/done"
        export GATE_NO_INSTALL=1 PYTHONUNBUFFERED=1
        setsid bash -c "set -o pipefail; $(declare -f run_suite run_memory run_calibrate run_gatepower); \
            logdir='$logdir'; run_$what $args; \
            echo \$? > '$logdir/done'; tar czf '$logdir/baselines_store.tgz' baselines_store" \
            > "$logdir/session.log" 2>&1 < /dev/null &
        echo "started $what (pid $!), logs in $logdir"
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
