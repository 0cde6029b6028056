# Sourced by the GPU scripts (gpu_check.sh, gpu_input.sh): how each of their steps runs and what it keeps.
# Expects OUT (the flat output folder) and LOG (its log file); fills WALLS with each step's seconds and exit code,
# as gpu_summary.py's --wall arguments.
WALLS=()

step() {                     # step NAME SECONDS COMMAND...: run it under a time limit (SIGINT first), log it
    local name=$1 limit=$2 start rc
    shift 2
    echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
    start=$(date +%s)
    timeout --signal=INT --kill-after=20 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    WALLS+=(--wall "$name=$(( $(date +%s) - start )) (exit $rc)")
    echo "=== $name: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$LOG"
}

keep() {                     # keep SRC DEST: a run's file, flat in OUT (what comes back from a remote machine)
    [ -f "$1" ] && cp "$1" "$OUT/$2"
}
