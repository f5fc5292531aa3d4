#!/usr/bin/env bash
# gpu_session.sh: one GPU measuring session, detached from the caller, logs and stored runs in one folder.
#
#   scripts/gpu_session.sh start LOGDIR suite|memory   start in a session of its own (survives the caller)
#   scripts/gpu_session.sh status LOGDIR               the last lines of each log, and whether it finished
#
#   suite:  correctness tests (the GPU ones run here), then `./gate perf` (MLP, CNN, energy; stored run autosaved)
#   memory: `./gate perf -m slow` (the max-batch searches, ~20-30 min)
#
# For machines whose commands are cut off after a few minutes (a lent GPU): start, then poll `status`.
# Needs the engine's packages importable already (GATE_NO_INSTALL=1 is set: no package registry assumed).
# GATE_COMMIT_ID names the commit in the stored run when the tree has no .git.
set -uo pipefail
cd "$(dirname "$0")/.."

command=${1:-}
logdir=${2:-}
[ -n "$command" ] && [ -n "$logdir" ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

run_suite() {
    python3 -m pytest correctness_tests -q -p no:cacheprovider -rs 2>&1 | tee "$logdir/correctness.log"
    ./gate perf -p no:cacheprovider 2>&1 | tee "$logdir/perf.log"
}

run_memory() {
    ./gate perf -p no:cacheprovider -m slow -s 2>&1 | tee "$logdir/memory.log"
}

case "$command" in
    start)
        what=${3:-}
        [ "$what" = suite ] || [ "$what" = memory ] || { echo "gpu_session: suite or memory, not '$what'" >&2; exit 2; }
        mkdir -p "$logdir"
        rm -f "$logdir/done"
        export GATE_NO_INSTALL=1 PYTHONUNBUFFERED=1
        setsid bash -c "set -o pipefail; $(declare -f run_suite run_memory); logdir='$logdir'; run_$what; \
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
