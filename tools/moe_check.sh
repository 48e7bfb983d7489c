#!/usr/bin/env bash
# tools/moe_check.sh — issue 40 on the GPU machine in one call (repo root, $OUT set; carry .deps when the image lacks
# PCRE2's dev files, tools/device_env.sh):
#   1. the Qwen3-MoE goldens (tools/make_goldens.py --only target_qwen3_moe, CPU), packed into $OUT/golden_moe.tgz;
#   2. transformers' Qwen3-MoE prefill at Qwen3-30B-A3B shapes (bench/torch_moe.py) in the background while
#   3. the CUDA build (dflash_cuda_tests, bench_moe, dflash) runs;
#   4. the CUDA op table's MoE cases and the golden MoE target on CUDA, for each grouped-GEMM variant in VARIANTS
#      (DFLASH_MOE_GEMM_VARIANT; GTEST_FILTER, default CudaOps.MoE:CudaTarget.*);
#   5. bench/bench_moe --gemm-only per variant, then the whole bench with the variant whose gate+up (SwiGLU) and down
#      GEMMs took least;
# and prints the RESULT lines last. Env: VARIANTS (default "0 1 2"), TORCH_IMPL (default grouped_mm,eager),
# SKIP_GOLDENS=1, SKIP_TORCH=1, BENCH_ARGS.
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
. tools/device_env.sh

if [ "${SKIP_GOLDENS:-0}" != 1 ]; then
  timeout 240 python3 tools/make_goldens.py --only target_qwen3_moe --out tests/golden >"$OUT/goldens.log" 2>&1
  say "goldens rc=$? $(grep -E '^SUMMARY|torch.topk|wrote experts' "$OUT/goldens.log" | tr '\n' ' ' | cut -c1-600)"
  tar czf "$OUT/golden_moe.tgz" tests/golden/target_qwen3_moe tests/golden/target_qwen3_moe_sharded
fi

PY=
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  (timeout -k 5 300 python3 bench/torch_moe.py --impl "${TORCH_IMPL:-grouped_mm,eager}" >"$OUT/torch_moe.log" 2>&1
   echo "[+$(( $(date +%s) - T0 ))s] torch_moe rc=$?" >>"$OUT/summary.txt") &
  PY=$!
fi

cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1 ||
  { say "configure FAILED"; tail -20 "$W/configure.log"; exit 1; }
if ! cmake --build build-cuda -j 14 --target dflash_cuda_tests bench_moe dflash >"$W/build.log" 2>&1; then
  say "build FAILED"; grep -E "error" "$W/build.log" | head -30; cp "$W/build.log" "$OUT/"; exit 1
fi
say "built"
[ -n "$PY" ] && wait "$PY"

: >"$OUT/cuda_tests.log"
for v in ${VARIANTS:-0 1 2}; do
  DFLASH_MOE_GEMM_VARIANT=$v timeout 120 build-cuda/dflash_cuda_tests --gtest_filter="${GTEST_FILTER:-CudaOps.MoE:CudaTarget.*}" >"$W/t$v.log" 2>&1
  say "variant $v: dflash_cuda_tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$W/t$v.log" | tr '\n' ' ') $(grep -cE ' FAIL$' "$W/t$v.log") failed checks"
  { echo "==== variant $v"; cat "$W/t$v.log"; } >>"$OUT/cuda_tests.log"
  DFLASH_MOE_GEMM_VARIANT=$v timeout 60 build-cuda/bench_moe --gemm-only --budget-s 2 >"$W/g$v.log" 2>&1
  grep -E "^RESULT name=moe_gemm" "$W/g$v.log" | sed "s/^RESULT /RESULT variant=$v /" | tee -a "$OUT/gemm_variants.txt"
done
BEST=$(python3 - "$OUT/gemm_variants.txt" <<'PY'
import re, sys
t = {}
for l in open(sys.argv[1]):
    kv = dict(re.findall(r'(\w+)=(\S+)', l))
    if kv["name"] in ("moe_gemm_swiglu", "moe_gemm_down"):
        t[kv["variant"]] = t.get(kv["variant"], 0) + float(kv["ms"])
print(min(t, key=t.get) if t else 0)
PY
)
say "fastest variant: $BEST"
DFLASH_MOE_GEMM_VARIANT=$BEST timeout 240 build-cuda/bench_moe ${BENCH_ARGS:-} >"$OUT/bench_moe.log" 2>&1
say "bench_moe (variant $BEST) rc=$?"

echo
grep -hE " FAIL$|qwen3_moe golden" "$OUT/cuda_tests.log" | head -20
grep -hE "^# |^RESULT" "$OUT/torch_moe.log" "$OUT/bench_moe.log" 2>/dev/null
say "done"
