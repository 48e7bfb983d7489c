#!/usr/bin/env bash
# One call on the GPU machine (repo root, $OUT set): build the CUDA backend, run the CUDA op table, the C11 export
# check against the PyTorch reference, the tiny training run on CPU and GPU side by side, and the GPU demo.
# Prints a short summary last; logs under $OUT.   Env: DEMO_BUDGET (s, default 150), SKIP_DEMO=1
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
RES=$OUT                # what comes back: summary.txt, cuda_tests.log, demo.log, logs.tgz (at most 8 files)
OUT=$(mktemp -d)        # working files and logs
SUM="$RES/summary.txt"
: >"$SUM"
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$SUM"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUM"

# 0. PCRE2 development files from .deps when the GPU machine's image lacks them (tools/device_env.sh)
. tools/device_env.sh

# 1. build (tests + binary) and the CUDA op table
cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1 || { say "configure FAILED"; tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build-cuda -j 16 --target dflash_cuda_tests dflash >"$OUT/build.log" 2>&1 || { say "build FAILED"; grep -E "error" "$OUT/build.log" | head -30; exit 1; }
say "built"
timeout 150 build-cuda/dflash_cuda_tests >"$OUT/cuda_tests.log" 2>&1
say "dflash_cuda_tests rc=$?  $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_tests.log" | tr '\n' ' ')"
cp "$OUT/cuda_tests.log" "$RES/"

# 2. C11: the committed export loads in the independent PyTorch reference
timeout 60 python3 tools/check_export.py >"$OUT/check_export.log" 2>&1
say "check_export rc=$? $(tail -1 "$OUT/check_export.log")"

# 3. the tiny CPU training run of the tests, on CPU and on GPU
B=build-cuda/dflash
T=tests/golden/target_qwen3
python3 - "$OUT/tiny.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for s in range(24):
        k, x = 1 + r.randrange(3), r.randrange(64)
        ids = [(x + k * p) % 64 for p in range(40)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": [int(p >= 6) for p in range(40)]}) + "\n")
PY
$B prepare --tokenizer assets/demo/target --input "$OUT/tiny.jsonl" --out "$OUT/tiny_data" >"$OUT/tiny_prepare.log" 2>&1 || say "tiny prepare failed (no tokenizer fixture?)"
for dev in cpu cuda; do
  timeout 120 $B train --target $T --data "$OUT/tiny_data" --out "$OUT/tiny_$dev" --device $dev --num-layers 1 --block-size 4 \
    --target-layer-ids 1,2 --mask-token-id 511 --max-anchors 8 --batch-size 2 --lr 1e-2 --warmup-ratio 0.02 --max-steps 300 \
    --seed 3 --quiet --checkpoint-every 0 >"$OUT/tiny_train_$dev.log" 2>&1
  say "tiny train $dev rc=$?"
done
python3 - "$OUT" <<'PY' | tee -a "$SUM"
import json, sys
o = sys.argv[1]
def load(d):
    try: return [json.loads(l) for l in open(f"{o}/tiny_{d}/metrics.jsonl")]
    except Exception as e: return []
c, g = load("cpu"), load("cuda")
if c and g:
    for a, b in [(0, 20), (140, 160), (280, 300)]:
        mc = sum(r["loss"] for r in c[a:b]) / (b - a); mg = sum(r["loss"] for r in g[a:b]) / (b - a)
        ec = sum(r["eal"] for r in c[a:b]) / (b - a); eg = sum(r["eal"] for r in g[a:b]) / (b - a)
        print(f"tiny steps {a+1}-{b}: loss cpu {mc:.4f} cuda {mg:.4f}  EAL cpu {ec:.3f} cuda {eg:.3f}")
    print("tiny peak memory (cuda)", max(r.get("peak_mem_bytes", 0) for r in g))
PY

# 3b. eval of one drafter on both devices: the same tau up to bf16 near-ties (EVAL_EXPORT: an exported drafter
#     for the demo target, e.g. the CPU demo's run/export carried in .deps)
if [ -n "${EVAL_EXPORT:-}" ] && [ -d "$EVAL_EXPORT" ]; then
  $B prepare --tokenizer assets/demo/target --input assets/demo/eval.jsonl.gz --out "$OUT/eval_data" --format raw \
    --max-length 1024 >"$OUT/eval_prepare.log" 2>&1
  for dev in cpu cuda; do
    timeout 200 $B eval --target assets/demo/target --drafter "$EVAL_EXPORT" --data "$OUT/eval_data" --device $dev \
      --mode both --max-samples 100 --no-progress --json "$OUT/eval_$dev.json" >"$OUT/eval_$dev.log" 2>&1
    say "eval $dev rc=$? $(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('teacher tau', j['teacher_forced']['tau'], 'generated tau', j['generated']['tau'], 'cycle mismatches', j.get('cycle_mismatches'))" "$OUT/eval_$dev.json" 2>&1 | tail -1)"
  done
fi

# 4. the GPU demo (larger drafter, longer) with the same command as the CPU one
if [ "${SKIP_DEMO:-0}" != 1 ]; then
  timeout $(( ${DEMO_BUDGET:-150} + 200 )) $B demo --device cuda --out "$OUT/demo" --budget "${DEMO_BUDGET:-150}" \
    --eval-samples 100 --generated-samples 30 >"$OUT/demo.log" 2>&1
  say "demo rc=$?"
  sed -n '/== dflash demo/,$p' "$OUT/demo.log" | tee -a "$SUM"
  cp "$OUT/demo/run/metrics.jsonl" "$OUT/demo_metrics.jsonl" 2>/dev/null
  rm -rf "$OUT/demo" "$OUT/tiny_cpu" "$OUT/tiny_cuda" "$OUT/tiny_data"
fi
cp "$OUT/cuda_tests.log" "$RES/" 2>/dev/null; cp "$OUT/demo.log" "$RES/" 2>/dev/null
cp "$OUT/demo_metrics.jsonl" "$RES/" 2>/dev/null
(cd "$OUT" && tar -czf "$RES/logs.tgz" --exclude='*.safetensors' --exclude='*data*' . 2>/dev/null)
echo; sed -n '/^==== CUDA backend checks/,/checks failed ====/p' "$OUT/cuda_tests.log" | tail -60
echo; cat "$SUM"
