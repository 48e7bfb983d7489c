#!/usr/bin/env bash
# tools/gptoss_check.sh — issue 36 (gpt-oss) on the GPU machine in one call (repo root, $OUT set; carry .deps when the
# image lacks PCRE2's dev files, tools/device_env.sh). Steps, each started only while the call's time allows
# (DEADLINE_S, default 560 s from the start):
#   1. transformers' gpt-oss-20b prefill (bench/torch_moe.py --family gpt_oss, bf16 experts, eager attention) in the
#      background while the CUDA build (dflash_cuda_tests, bench_moe, dflash) runs;
#   2. the CUDA op table's gpt-oss cases, the MoE cases and the golden targets on CUDA (GTEST_FILTER overrides);
#   3. bench_moe --config bench/configs/gpt-oss-20b-bf16.json and gpt-oss-20b.json (MXFP4): the prefill with capture;
#   4. bench_moe --experts at gpt-oss-20b's expert shapes per grouped-GEMM variant in VARIANTS (bf16 against MXFP4);
#   5. gpt-oss-120b (MXFP4): bench_moe's weights in use and prefill, then co-located training (target + 5-layer drafter)
#      by dflash train --random-target on cuda:0 (STEPS steps);
# and prints the summary and the RESULT lines last. Env: VARIANTS (default "1 0"), SKIP_TORCH=1, STEPS (default 6).
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
DEADLINE=${DEADLINE_S:-560}
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
# time_ok N: at least N seconds left before the deadline
time_ok() { [ "$(left)" -ge "$1" ] || { say "skipped (only $(left) s left): $2"; return 1; }; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
. tools/device_env.sh

PY=
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  (timeout -k 5 200 python3 bench/torch_moe.py --family gpt_oss --impl "${TORCH_IMPL:-grouped_mm}" --budget-s 12 \
     >"$OUT/torch_gptoss.log" 2>&1
   echo "[+$(( $(date +%s) - T0 ))s] torch_gptoss rc=$?" >>"$OUT/summary.txt") &
  PY=$!
fi

cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1 ||
  { say "configure FAILED"; tail -20 "$W/configure.log"; exit 1; }
if ! cmake --build build-cuda -j 14 --target dflash_cuda_tests bench_moe dflash >"$W/build.log" 2>&1; then
  say "build FAILED"; grep -E "error" "$W/build.log" | head -30; cp "$W/build.log" "$OUT/"; exit 1
fi
say "built"
[ -n "$PY" ] && wait "$PY"

FILTER=${GTEST_FILTER:-CudaOps.MoeGptOss:CudaOps.AttentionCausalSinksWindow:CudaOps.MoE:CudaTarget.*}
if time_ok 60 "op table"; then
  timeout $(( $(left) > 170 ? 150 : $(left) - 20 )) build-cuda/dflash_cuda_tests --gtest_filter="$FILTER" >"$OUT/cuda_tests.log" 2>&1
  say "dflash_cuda_tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_tests.log" | tr '\n' ' ') $(grep -cE ' FAIL$' "$OUT/cuda_tests.log") failed checks"
  grep -E " FAIL$|Failure$|^\[  FAILED" "$OUT/cuda_tests.log" | head -20 | tee -a "$OUT/summary.txt"
  grep -E "golden:" "$OUT/cuda_tests.log" | tee -a "$OUT/summary.txt"
fi

for cfg in gpt-oss-20b-bf16 gpt-oss-20b; do
  time_ok 70 "prefill $cfg" || continue
  timeout 100 build-cuda/bench_moe --config bench/configs/$cfg.json --budget-s 5 --max-reps 4 >"$OUT/prefill_$cfg.log" 2>&1
  say "bench_moe $cfg rc=$? $(grep -E 'random weights built' "$OUT/prefill_$cfg.log" | cut -c1-260)"
  grep -E "^RESULT" "$OUT/prefill_$cfg.log" | sed "s/^RESULT /RESULT config=$cfg /" >>"$OUT/results.txt"
done

for v in ${VARIANTS:-1 0}; do
  time_ok 40 "experts variant $v" || continue
  DFLASH_MOE_GEMM_VARIANT=$v timeout 60 build-cuda/bench_moe --experts 2880,2880,32,4 --budget-s 2 >"$W/g$v.log" 2>&1
  grep -E "^RESULT" "$W/g$v.log" | sed "s/^RESULT /RESULT variant=$v /" >>"$OUT/results.txt"
done

if time_ok 90 "120b prefill"; then
  timeout 150 build-cuda/bench_moe --config bench/configs/gpt-oss-120b.json --budget-s 3 --max-reps 3 >"$OUT/prefill_120b.log" 2>&1
  say "bench_moe gpt-oss-120b rc=$? $(grep -E 'random weights built' "$OUT/prefill_120b.log" | cut -c1-300)"
  grep -E "^RESULT" "$OUT/prefill_120b.log" | sed "s/^RESULT /RESULT config=gpt-oss-120b /" >>"$OUT/results.txt"
fi

if time_ok 100 "120b co-located training"; then
  B=build-cuda/dflash
  mkdir -p "$W/t120"
  cp bench/configs/gpt-oss-120b.json "$W/t120/config.json"
  python3 bench/q8_data.py "$W/unused_config.json" "$W/rows.jsonl" 48 >/dev/null
  $B prepare --tokenizer assets/demo/target --input "$W/rows.jsonl" --out "$W/data" >"$W/prep.log" 2>&1 || tail -5 "$W/prep.log"
  timeout $(( $(left) - 10 )) $B train --target "$W/t120" --random-target --data "$W/data" --mask-token-id 200000 \
    --num-layers 5 --block-size 16 --max-anchors 512 --max-steps "${STEPS:-6}" --batch-size 4 --loss decay --device cuda:0 --quiet \
    --no-export --checkpoint-every 0 --out "$W/coloc" >"$OUT/coloc_120b.log" 2>&1
  say "120b co-located rc=$? $(tail -2 "$OUT/coloc_120b.log" | tr '\n' ' ' | cut -c1-300)"
  cp "$W/coloc/metrics.jsonl" "$OUT/metrics_120b.jsonl" 2>/dev/null
  python3 - "$W/coloc/metrics.jsonl" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
try:
    m = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    m = []
st = m[2:] if len(m) > 3 else m
if st:
    ctx = sum(r["target_tokens"] for r in st) / sum(r["step_s"] for r in st)
    mem = {k: round(v / 2**30, 1) for k, v in st[-1].get("peak_mem_bytes", {}).items()}
    print(f"RESULT name=gptoss120b_coloc impl=dflash steps={len(m)} ctx_tok_s={ctx:.0f} peak_gib={mem} "
          f"last_loss={m[-1].get('loss')}")
else:
    print("RESULT name=gptoss120b_coloc impl=dflash no metrics")
PY
fi

echo "==== summary"
cat "$OUT/summary.txt"
grep -hE "^RESULT" "$OUT"/torch_gptoss.log 2>/dev/null
cat "$OUT/results.txt" 2>/dev/null
