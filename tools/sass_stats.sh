#!/usr/bin/env bash
# tools/sass_stats.sh — per-kernel SASS statistics of CUDA sources, on the GPU machine (this machine's toolkit has no
# cuobjdump). Each source is compiled alone to a cubin with the build's CUDA flags (CMakeLists.txt's DFLASH_CUDA_FLAGS
# plus -O3) against its own tree's src/ and include/, disassembled by `cuobjdump -sass`, and counted by
# tools/sass_stats.py: instructions, HGMMA, MUFU, BRA, BSSY (divergent regions: a masked select compiled into a
# branch per element shows there, bench/NOTES.md 15), STL / LDL (spills), one row per kernel and source.
#   device:  OUT=$OUT bash tools/sass_stats.sh [SRC.cu ...]    (default src/backend/cuda/attention_wgmma.cu)
#   A / B:   OUT=$OUT bash tools/sass_stats.sh .ab-base/src/backend/cuda/attention_wgmma.cu src/backend/cuda/attention_wgmma.cu
# env: OPS (opcodes to count, comma-separated), MATCH (only kernels whose name holds it), KEEP=1 (leave the .sass
# listings under $OUT as sass.tgz). Exit status: 1 when a compilation fails, 2 when no kernel is found.
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$OUT"
command -v cuobjdump >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
command -v cuobjdump >/dev/null || { echo "sass_stats: no cuobjdump here (the GPU machine's toolkit has it)"; exit 1; }
[ $# -gt 0 ] || set -- src/backend/cuda/attention_wgmma.cu
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
specs=()
for src in "$@"; do
  case "$src" in
    *src/backend/*.cu) ;;
    *) echo "sass_stats: $src: a source under some tree's src/backend/"; exit 1 ;;
  esac
  root=${src%src/backend/*}  # the tree the source belongs to ("" for this one)
  label=$([ -n "$root" ] && basename "$root" || echo "$([ $# -gt 1 ] && echo new || echo tree)")
  label="$label:$(basename "$src" .cu)"
  f=$(printf '%s' "$label" | tr -c 'A-Za-z0-9_-' '_')
  nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo \
    -I"${root}src" -I"${root}include" -cubin -o "$W/$f.cubin" "$src" >"$W/$f.log" 2>&1 ||
    { echo "sass_stats: $src does not compile:"; grep -E "error" "$W/$f.log" | head -10; exit 1; }
  cuobjdump -sass "$W/$f.cubin" >"$W/$f.sass" || exit 1
  specs+=("$label=$W/$f.sass")
done
python3 tools/sass_stats.py "${specs[@]}" ${OPS:+--ops "$OPS"} ${MATCH:+--match "$MATCH"}
rc=$?
[ "${KEEP:-0}" = 1 ] && (cd "$W" && tar czf "$OUT/sass.tgz" ./*.sass)  # (named after the labels)
exit $rc
