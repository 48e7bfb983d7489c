#!/usr/bin/env bash
# bench/attn_ab.sh — A/B of the attention kernels on the GPU machine: the working tree against a base tree, built
# side by side and timed alternately in one call, so that the spread between machines (a few % between H200s of
# the pool, bench/NOTES.md 14) stays out of the comparison.
#   here:    rm -rf .ab-base && mkdir .ab-base && git archive BASE | tar -xm -C .ab-base --exclude=assets
#            (.ab-* trees are git-ignored; the benchmark needs no assets, and carry holds 64 MiB)
#   device:  OUT=$OUT bash bench/attn_ab.sh                                   (carry [".deps", ".ab-base"])
# More variants in the same call: TREES=".ab-base .ab-x" (each a git-ignored .ab-* tree, carried too), each built
# and timed in turn with the working tree, named by what follows ".ab-"; TREES="" times the working tree alone (with
# TL=1: its timeline alone).
# env: RUNS (alternations, default 2), BUDGET_S (bench_attention --budget-s, default 2), TESTS (1: first the
#      attention / drafter rows of the CUDA op table on the working tree; 0: skip), TL (1: then the forward's
#      timeline, -DDFLASH_FWD_TIMELINE, of every tree), ARGS (more bench_attention arguments, e.g. "--window 64"),
#      TEST_TIMEOUT / BENCH_TIMEOUT (seconds for the op table / each bench run, default 300 / 120: a kernel that
#      hangs costs that much of the call, not all of it; rc 124 in the output).
# Prints the working tree's op-table count, then per run "== NAME" for each tree and "== new" for the working tree
# (odd runs in that order, even runs the working tree first),
# with the bench's exit status and its RESULT lines (attn_fwd, attn_fwd_bwd, attn_causal_*, attn_error), then the
# TIMELINE lines. The logs come back in $OUT/logs_ab.tgz (the device returns at most 8 files).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
TREES=${TREES-.ab-base}  # (set but empty: the working tree alone)
NAMES=()
DIRS=()
for d in $TREES; do
  d=${d%/}
  case "$d" in
    .ab-new | */* | .ab-) echo "attn_ab: tree $d: a .ab-NAME folder in the repository root, NAME not 'new'"; exit 2 ;;
    .ab-*) ;;
    *) echo "attn_ab: tree $d: a .ab-NAME folder in the repository root (git-ignored)"; exit 2 ;;
  esac
  [ -d "$d" ] || { echo "attn_ab: no $d here (git archive BASE | tar -x -C $d, and carry it)"; exit 2; }
  DIRS+=("$d")
  NAMES+=("${d#.ab-}")
done
T0=$(date +%s)
rm -rf /tmp/ab-build-*  # (a warm machine keeps them: never time a stale base)
. tools/device_env.sh  # PCRE2 development files from .deps when the image lacks them
el() { echo "[+$(( $(date +%s) - T0 ))s]"; }
# build NAME SRC BUILD_DIR TARGETS [DEFINE]: configure and build TARGETS of SRC in BUILD_DIR (Release, CUDA)
build() {
  local flags=()
  [ -n "${5:-}" ] && flags=("-DCMAKE_CUDA_FLAGS=-D$5" "-DCMAKE_CXX_FLAGS=-D$5")
  # shellcheck disable=SC2086  # ($4: several targets)
  cmake -S "$2" -B "$3" -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >"$OUT/configure_$1.log" 2>&1 &&
    cmake --build "$3" -j "$(nproc)" --target $4 >"$OUT/build_$1.log" 2>&1 ||
    { echo "attn_ab: build $1 failed"; grep -E "error" "$OUT/build_$1.log" | head -20; exit 1; }
}
TESTS=${TESTS:-1}
# the trees build side by side (each build's long pole is one file, attention_wgmma.cu, on one core)
pids=()
for d in "${DIRS[@]}"; do build "${d#.ab-}" "$d" "/tmp/ab-build-${d#.ab-}" bench_attention & pids+=($!); done
build new . build-cuda "bench_attention$([ "$TESTS" = 1 ] && echo ' dflash_cuda_tests')"
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
echo "$(el) built"
if [ "$TESTS" = 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" build-cuda/dflash_cuda_tests --gtest_filter='CudaOps.*Attention*:CudaDrafter.*:CudaThreads.*' \
    >"$OUT/tests.log" 2>&1
  rc=$?
  echo "$(el) op table rc=$rc: $(grep -c ' PASS$' "$OUT/tests.log") checks passed, $(grep -c ' FAIL$' "$OUT/tests.log") failed"
  grep -E "^\[  PASSED|^\[  FAILED|^\[  FAILED  \]| FAIL$" "$OUT/tests.log" | head -20
fi
for r in $(seq 1 "${RUNS:-2}"); do
  # (odd runs time the base trees first, even runs the working tree first: whichever runs second in a pair may run
  # at a lower clock after the first's load, so a fixed order would bias every comparison one way)
  order=("${NAMES[@]}" new)
  [ $((r % 2)) = 0 ] && order=(new "${NAMES[@]}")
  for side in "${order[@]}"; do
    B=$([ $side = new ] && echo build-cuda || echo "/tmp/ab-build-$side")
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-120}" "$B/bench_attention" --budget-s "${BUDGET_S:-2}" ${ARGS:-} >"$OUT/bench_${side}_$r.log" 2>&1
    echo "== $side (run $r, rc=$?)"
    grep -E "^RESULT name=attn_(fwd|fwd_bwd|causal|error)" "$OUT/bench_${side}_$r.log" |
      sed -E 's/ (S|N|B|nh|nkv|d|seqs|reps|layout|per_seq_ms)=[^ ]+//g'
  done
done
echo "$(el) benched"
if [ "${TL:-0}" = 1 ]; then
  for d in "${DIRS[@]}"; do build "${d#.ab-}_tl" "$d" "/tmp/ab-build-${d#.ab-}-tl" bench_attention DFLASH_FWD_TIMELINE; done
  build new_tl . build-cuda-tl bench_attention DFLASH_FWD_TIMELINE
  for side in "${NAMES[@]}" new; do
    B=$([ $side = new ] && echo build-cuda-tl || echo "/tmp/ab-build-$side-tl")
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-120}" "$B/bench_attention" --budget-s 1 --max-reps 3 ${ARGS:-} >"$OUT/timeline_$side.log" 2>&1
    echo "== timeline $side (rc=$?)"
    grep TIMELINE "$OUT/timeline_$side.log"
  done
fi
echo "$(el) done"
( cd "$OUT" && find . -maxdepth 1 -type f -name '*.log' -printf '%f\n' | tar czf logs_ab.tgz -T - && rm -f ./*.log )
