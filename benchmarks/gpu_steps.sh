# Sourced by the GPU scripts (gpu_check.sh, gpu_input.sh, gpu_quick.sh), from the checkout's root, with OUT (the
# flat output folder) set: the interpreter (PY, PYTHON=... picks it), a scratch folder (WORK), the log (LOG), this
# checkout's trainfast on the path (nothing is installed), how each step runs and what it keeps. Fills WALLS with
# each step's seconds and exit code, as gpu_summary.py's --wall arguments.
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
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
