#!/usr/bin/env bash
# The GPU check: every GPU test and benchmark in one call, for the lent GPU machine, which arrives bare and can
# download nothing (its image has torch, transformers, triton, accelerate and pytest). The package runs from this
# checkout (PYTHONPATH, python -m ...): nothing is installed, pip reaches no index. Each step runs in its own
# process under its own time limit; one that fails or runs out of time does not stop the next. Progress lines go
# to the terminal, everything else under $OUT (default ./gpu-check), at most 8 files:
#   environment.txt kernel_tests.txt tree_verify.txt draft.txt trees.txt draft_4bit.txt results.jsonl summary.txt
# Two steps take a call of their own (--steps compiled, --steps placement): speculation with compiled steps on static
# caches against transformers' compiled plain decoding, and a target half offloaded by accelerate.
# docs/benchmarks.md ("On a GPU") says what each holds and how to read it.
#
#   bash tools/gpu_check.sh                        # on the GPU machine: about 5 minutes on an H200, 10 at most
#   bash tools/gpu_check.sh --rehearse             # on a CPU: the same steps at tiny shapes (TRITON_INTERPRET=1)
#   bash tools/gpu_check.sh --steps draft,trees    # only these steps (a rerun)
#   bash tools/gpu_check.sh --steps compiled       # a step that takes a call of its own (also: placement)
#
# bitsandbytes (the 4-bit draft) is not in the image: a wheel in .whl/ (carried to the machine) is installed from
# the file (pip --no-index --target), else the check says that the 4-bit draft was not checked, and why.
set -uo pipefail
cd "$(dirname "$0")/.."

REHEARSE=""
ALL_STEPS="environment,kernel_tests,tree_verify,draft,trees,draft_4bit"
OWN_CALL_STEPS="compiled,placement"  # each too long to share a call with the others
STEPS=$ALL_STEPS
while [ $# -gt 0 ]; do
    case "$1" in
        --rehearse) REHEARSE="--rehearse" ;;
        --steps) STEPS="$2"; shift ;;
        --steps=*) STEPS="${1#--steps=}" ;;
        *) echo "usage: bash tools/gpu_check.sh [--rehearse] [--steps $ALL_STEPS,$OWN_CALL_STEPS]" >&2
           exit 2 ;;
    esac
    shift
done

OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-$(command -v python3 || command -v python)}
SITE=${TMPDIR:-/tmp}/gpu-check-site
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_DISABLE_PROGRESS_BARS=1
if [ -n "$REHEARSE" ]; then  # the CPU, even where a GPU is present; Triton's kernels through its interpreter
    # one thread: on a busy shared CPU two wait on each other at every matmul (the figures mean nothing here)
    export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 OMP_NUM_THREADS=1
    PYTEST_SELECT=(-k "compaction or verifier_choice or jitted or micro_benchmark")
    SCALE=4  # a shared CPU is slower than the GPU at anything: the time limits, times 4
else
    PYTEST_SELECT=()
    SCALE=1
fi
STATUS=""
START=$SECONDS

log() { echo "[gpu-check $(date +%H:%M:%S) +$((SECONDS - START))s] $*"; }
wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

# step NAME LIMIT_SECONDS COMMAND...: run COMMAND under its limit, output appended to $OUT/NAME.txt
step() {
    local name=$1 limit=$(($2 * SCALE)) begin=$SECONDS rc
    shift 2
    wanted "$name" || return 0
    log "$name: start (limit ${limit}s)"
    timeout --kill-after=15 "$limit" "$@" >> "$OUT/$name.txt" 2>&1
    rc=$?
    STATUS="$STATUS $name:$rc:$((SECONDS - begin))"
    case $rc in
        0) log "$name: ok in $((SECONDS - begin))s" ;;
        124|137) log "$name: OUT OF TIME after $((SECONDS - begin))s (limit ${limit}s): see $OUT/$name.txt" ;;
        *) log "$name: FAILED (rc $rc) in $((SECONDS - begin))s: $(tail -n 1 "$OUT/$name.txt")" ;;
    esac
}

# bitsandbytes from a carried wheel (.whl/bitsandbytes-*.whl): from the file, no index, into $SITE
install_bitsandbytes() {
    local wheel
    wheel=$(ls .whl/bitsandbytes-*.whl 2>/dev/null | head -n 1)
    if timeout 10 "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('bitsandbytes') is None)"; then
        echo "bitsandbytes: importable"
    elif [ -z "$wheel" ]; then
        echo "bitsandbytes: not installed and no wheel in .whl/"
    elif rm -rf "$SITE" && timeout 30 "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
            --no-cache-dir --disable-pip-version-check --target "$SITE" "$wheel"; then
        export PYTHONPATH="$PYTHONPATH:$SITE"
        echo "bitsandbytes: installed from $wheel"
    else
        echo "bitsandbytes: installing $wheel failed"
    fi
}

for name in ${ALL_STEPS//,/ } ${OWN_CALL_STEPS//,/ }; do
    if wanted "$name"; then : > "$OUT/$name.txt"; fi
done
# a rerun of some steps appends their records; the summary reads each step's latest
[ "$STEPS" = "$ALL_STEPS" ] && rm -f "$OUT/results.jsonl"
log "python $PY, OUT=$OUT, steps $STEPS${REHEARSE:+ (rehearsal: CPU, tiny shapes)}"
if wanted draft_4bit; then
    install_bitsandbytes >> "$OUT/draft_4bit.txt" 2>&1
    log "$(tail -n 1 "$OUT/draft_4bit.txt")"
fi

GPU_TESTS=$(grep -lE '^(pytestmark = pytest\.mark\.gpu|\s*@pytest\.mark\.gpu)' tests/test_*.py | tr '\n' ' ')
# the limits add up to 555 s (595 s with the bitsandbytes install), within the device's 600 s a call
step environment 20 "$PY" tools/gpu_check.py environment $REHEARSE --out "$OUT"
# shellcheck disable=SC2086
step kernel_tests 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider ${PYTEST_SELECT[@]+"${PYTEST_SELECT[@]}"} $GPU_TESTS
step tree_verify 50 "$PY" tools/gpu_check.py tree-verify $REHEARSE --out "$OUT"
step draft 140 "$PY" tools/gpu_check.py draft $REHEARSE --out "$OUT"
step trees 100 "$PY" tools/gpu_check.py trees $REHEARSE --out "$OUT"
step draft_4bit 140 "$PY" tools/gpu_check.py draft_4bit $REHEARSE --out "$OUT"
step compiled 560 "$PY" tools/gpu_check.py compiled $REHEARSE --out "$OUT"
step placement 300 "$PY" tools/gpu_check.py placement $REHEARSE --out "$OUT"

log "summary (total $((SECONDS - START))s)"
timeout 15 "$PY" tools/gpu_check_summary.py $REHEARSE --out "$OUT" --status "$STATUS" > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
for item in $STATUS; do  # name:rc:seconds; exit 1 when any step did not exit 0
    rc=${item#*:}
    [ "${rc%%:*}" = 0 ] || exit 1
done
