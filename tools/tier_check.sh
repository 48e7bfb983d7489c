#!/usr/bin/env bash
# tools/tier_check.sh — the CUDA kernel tiers on the GPU machine (issue 53; backend/kernel_tier.h, docs/gpus.md): the
# portable tier (what A100, A10, L40S, RTX and Blackwell cards run) forced on the Hopper card with
# DFLASH_KERNELS=portable, tested and timed beside the Hopper tier. From the repo root, in steps that fit one device
# call each:
#   STEP=build   configure build-tiers for ARCHS (default: CMakeLists.txt's list, every card) and build
#                dflash, dflash_cuda_tests and the benches (-j$JOBS); prints `dflash info --device cuda` on both tiers
#   STEP=ops     the whole CUDA op table (GTEST_FILTER overrides) with DFLASH_KERNELS=portable
#   STEP=bench   each of these on both tiers, one after the other in the same call: bench_attention (DFlash attention
#                forward / backward and the causal prefill attention), bench_step (the drafter step, Qwen3-8B shapes,
#                B 16), bench_prefill (Qwen3-8B target, 4 x 3072), bench_moe (Qwen3-30B-A3B target and its grouped
#                GEMMs); then flex_attention (bench/torch_ref.py --part attn) on the same card
#   STEP=demo    the GPU demo (co-located target and drafter, its 360 s budget) on the portable tier, interrupted
#                after INTERRUPT_S (120) seconds and resumed to the end (`dflash demo --device cuda [--resume]`)
# Logs in $OUT (default build-tiers/tier_check); the last lines printed are the table (RESULT lines, tier first).
set -u
T0=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build-tiers/tier_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-16}
say() { echo "[tier_check +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
source tools/device_env.sh
B=${B:-build-tiers}  # (its own build directory: every card's targets, apart from the Hopper-only build-cuda)
# run_tiers NAME CMD...: CMD on the Hopper tier, then the portable one; its RESULT lines prefixed with the tier
run_tiers() {
  local name=$1
  shift
  for tier in hopper portable; do
    DFLASH_KERNELS=$tier "$@" >"$OUT/${name}_$tier.log" 2>&1
    say "$name ($tier) rc=$?"
    grep '^RESULT' "$OUT/${name}_$tier.log" | sed "s/^/$tier /" >>"$OUT/results.txt"
  done
}
case "${STEP:-build}" in
  build)
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader | tee -a "$OUT/summary.txt"
    # every card's targets by default (CMakeLists.txt's list), not device_env.sh's Hopper-only one: the build that
    # users get is the one tested
    cmake -S . -B $B -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
      -DDFLASH_CUDA_ARCHS="${ARCHS:-80-real;86-real;89-real;90a-real;89-virtual}" \
      >"$OUT/configure.log" 2>&1 || { say "configure FAILED"; tail -30 "$OUT/configure.log"; exit 1; }
    grep "CUDA backend" "$OUT/configure.log" | tee -a "$OUT/summary.txt"
    if ! cmake --build $B -j "$JOBS" --target dflash dflash_cuda_tests bench_attention bench_step bench_prefill \
        bench_moe >"$OUT/build.log" 2>&1; then
      say "build FAILED"
      grep -E "error|Error" "$OUT/build.log" | head -40
      exit 1
    fi
    say "built"
    for tier in hopper portable; do DFLASH_KERNELS=$tier $B/dflash info --device cuda | tee -a "$OUT/summary.txt"; done
    ;;
  ops)
    DFLASH_KERNELS=portable timeout "${TEST_TIMEOUT_S:-540}" $B/dflash_cuda_tests --gtest_filter="${GTEST_FILTER:-*}" \
      >"$OUT/tests_portable.log" 2>&1
    say "dflash_cuda_tests (portable) rc=$?"
    grep -E "^\[  (FAILED|PASSED) |^\[==========\]|Failure|exception" "$OUT/tests_portable.log" | tail -30
    sed -n '/^==== CUDA backend checks/,/^==== .* checks failed ====/p' "$OUT/tests_portable.log" | tail -40
    ;;
  bench)
    : >"$OUT/results.txt"
    run_tiers attention $B/bench_attention
    run_tiers step $B/bench_step --B 16 --modes normal --c02-steps 0 --budget-s 8 --max-reps 3
    run_tiers prefill $B/bench_prefill --T-batch 3072 --batch 4 --budget-s 3 --max-reps 3
    run_tiers moe $B/bench_moe --budget-s 3
    CD=$(mktemp -d)
    TORCHINDUCTOR_CACHE_DIR=$CD/i TRITON_CACHE_DIR=$CD/t timeout -k 5 200 python3 bench/torch_ref.py --part attn \
      >"$OUT/torch_attn.log" 2>&1
    say "torch_ref --part attn rc=$?"
    grep '^RESULT' "$OUT/torch_attn.log" | sed "s/^/torch /" >>"$OUT/results.txt"
    cat "$OUT/results.txt"
    ;;
  demo)
    # interrupted (SIGINT) after INTERRUPT_S seconds, then resumed to the end of its budget
    export DFLASH_KERNELS=portable
    timeout -s INT "${INTERRUPT_S:-120}" $B/dflash demo --device cuda --out "$OUT/demo" >"$OUT/demo_part1.log" 2>&1
    say "demo (portable), interrupted: rc=$?"
    $B/dflash demo --device cuda --out "$OUT/demo" --resume >"$OUT/demo_part2.log" 2>&1
    say "demo (portable), resumed: rc=$?"
    grep -h "kernels:" "$OUT/demo_part1.log" | head -12
    tail -25 "$OUT/demo_part2.log"
    cp "$OUT/demo/summary.json" "$OUT/summary_portable.json" 2>/dev/null
    rm -rf "$OUT/demo/data" "$OUT/demo/run/checkpoints" "$OUT/demo/run/export"
    ;;
esac
say "done"
