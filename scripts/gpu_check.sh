#!/usr/bin/env bash
# The GPU check: what is worth knowing about the engine on a CUDA machine, in one run of under 8 minutes.
#
#   scripts/gpu_check.sh [--quick] [--emulate] [RESULTS_DIR]
#
# Fitted to the machine it meets: one GPU, offline, the repository carried as it is (no weights: the embedded GGUF
# is over what travels), a python3 with torch and transformers but no gradio, no gguf and maybe no pytest, and
# at most 8 result files. So nothing is installed and no model is read from disk: scripts/gpu_check.py builds
# SmolLM2-1.7B and SmolLM2-135M from their configurations with random weights (the costs are the shapes') and
# measures there. RESULTS_DIR defaults to $OUT, else runs/gpu-check. It receives (6 files):
#   summary.md      one line per part: passed / FAILED / skipped, with its time
#   env.txt         nvidia-smi, python, torch, CUDA and transformers versions
#   results.md      the tables: device, greedy identity of every lossless method on CUDA, snapshot -> resume on
#                   CUDA, tokens/s per method, the verify forward's cost against its rows
#   results.jsonl   the same as one record per measurement
#   check.log       scripts/gpu_check.py's output
#   tests.log       the device-parametrized engine tests on CUDA, where pytest is installed (else skipped)
# It exits non-zero when a part failed.
#
# --quick: small shapes and a few tokens. --emulate: on a CPU-only machine, under the `spaces` package's CUDA
# emulation with the packages the GPU machine lacks made unimportable (tests/test_gpu_check.py runs
# `--quick --emulate`, so the script cannot rot before a GPU machine is spent on it).
# Python: $PYTHON, else .venv/bin/python, else python3.
set -uo pipefail

QUICK=0
EMULATE=0
RESULTS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --emulate) EMULATE=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option '$1' (use --quick, --emulate, RESULTS_DIR)" >&2; exit 2 ;;
    *) RESULTS="$1"; shift ;;
  esac
done

cd "$(dirname "$0")/.."
REPO="$PWD"
RESULTS="${RESULTS:-${OUT:-runs/gpu-check}}"
mkdir -p "$RESULTS" || { echo "gpu_check.sh: cannot create $RESULTS" >&2; exit 2; }
RESULTS="$(cd "$RESULTS" && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DYNASD_FETCH=0 HF_HUB_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false

SUMMARY="$RESULTS/summary.md"
FAILED=0
START=$SECONDS
echo "# GPU check$([ $QUICK = 1 ] && echo ' --quick')$([ $EMULATE = 1 ] && echo ' --emulate'), $(date -u +%FT%TZ)" \
  >"$SUMMARY"

# part NAME LIMIT_S LOG COMMAND...: runs one part under a time limit, records its outcome and time
part() {
  local name="$1" limit="$2" log="$3"; shift 3
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  if [ $rc = 0 ]; then
    echo "- $name: passed (${took} s, $(basename "$log"))" >>"$SUMMARY"
  else
    FAILED=1
    local why="exit $rc"; [ $rc = 124 ] && why="over its ${limit} s limit"
    echo "- $name: FAILED, $why (${took} s, $(basename "$log"))" >>"$SUMMARY"
  fi
  echo "$name: rc=$rc, ${took} s"
}
skip() { echo "- $1: skipped ($2)" >>"$SUMMARY"; echo "$1: skipped ($2)"; }

# -- the machine -------------------------------------------------------------------------------------------------
{
  command -v nvidia-smi >/dev/null && nvidia-smi
  "$PYTHON" -c "import sys, torch, transformers; print('python', sys.version.split()[0]); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); \
print('transformers', transformers.__version__)"
} >"$RESULTS/env.txt" 2>&1

# -- the measurements (one process: the models are built once per dtype) ----------------------------------------
FLAGS=()
[ $QUICK = 1 ] && FLAGS+=(--quick)
[ $EMULATE = 1 ] && FLAGS+=(--emulate)
part "measurements" 400 "$RESULTS/check.log" "$PYTHON" scripts/gpu_check.py "$RESULTS" "${FLAGS[@]}" --time-limit 330

# -- the device tests, where pytest is there ----------------------------------------------------------------------
if [ $QUICK = 1 ] || [ $EMULATE = 1 ]; then
  skip "tests on cuda" "--quick"
elif "$PYTHON" -c "import pytest" >/dev/null 2>&1; then
  part "tests on cuda" 150 "$RESULTS/tests.log" "$PYTHON" -m pytest -q -p no:cacheprovider -k "cuda and not embedded" \
    tests/test_devices.py tests/test_greedy_identity.py tests/test_snapshot.py
else
  skip "tests on cuda" "no pytest in $PYTHON"
fi

echo "" >>"$SUMMARY"
echo "total: $((SECONDS - START)) s; results in $RESULTS" >>"$SUMMARY"
cat "$SUMMARY"
exit $FAILED
