#!/usr/bin/env bash
# bench/moe_pipeline.sh — co-located training with an MoE target on one GPU (issue 40): ours vs the PyTorch rendition
# of the same design. Run from the repo root on an nvidia-h200 machine with $OUT set (carry .deps, tools/device_env.sh):
#     OUT=... bash bench/moe_pipeline.sh        env: STEPS (default 8), SKIP_TORCH=1, SKIP_BUILD=1
# Target: Qwen3-30B-A3B shapes (48 layers, H 2048, 128 experts top-8 of width 768) with random weights; drafter: 5
# layers, H 2048, intermediate 6144 (the default for an MoE target), B 16, 512 anchors, S 3072, 4 sequences per step.
# 1. bench/torch_pipeline.py --target-family qwen3_moe --layouts coloc1 (HF Qwen3MoeModel with grouped_mm experts and
#    the torch.compile(flex) drafter, one thread each) in the background while dflash builds;
# 2. dflash train --random-target on cuda:0 (a target worker and a drafter worker on one GPU);
# 3. the context tokens/s and peak memory of both, and the ratio.
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
STEPS=${STEPS:-8}
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
. tools/device_env.sh
MOE="--target-family qwen3_moe --H 2048 --I 6144 --nh 32 --nkv 4 --d 128 --target-layers 48 --experts 128 --top-k 8 --moe-I 768"
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  (CD=$(mktemp -d); TORCHINDUCTOR_CACHE_DIR=$CD/i TRITON_CACHE_DIR=$CD/t timeout -k 5 ${TORCH_LIMIT_S:-200} \
     python3 bench/torch_pipeline.py --part layouts --layouts coloc1 --steps ${TORCH_STEPS:-4} --layout-timeout 120 $MOE \
       >"$OUT/torch_moe_pipeline.log" 2>&1; echo "torch rc=$?" >>"$OUT/torch_moe_pipeline.log") &
  PY=$!
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1
  timeout 330 cmake --build build-cuda -j 14 --target dflash >"$W/build.log" 2>&1
  say "build rc=$?"; grep -E "error" "$W/build.log" | head -20
fi
B=build-cuda/dflash
mkdir -p "$W/q30"
python3 bench/q8_data.py "$W/q30/config.json" "$W/rows.jsonl" 64 qwen3-30b-a3b
$B prepare --tokenizer assets/demo/target --input "$W/rows.jsonl" --out "$W/data" >"$W/prep.log" 2>&1 || tail -5 "$W/prep.log"
[ -n "${PY:-}" ] && { wait "$PY"; say "torch done"; }
timeout 240 $B train --target "$W/q30" --random-target --data "$W/data" --mask-token-id 151669 --num-layers 5 \
  --block-size 16 --max-anchors 512 --max-steps "$STEPS" --batch-size 4 --loss decay --device cuda:0 --quiet --no-export \
  --checkpoint-every 0 --out "$W/coloc1" >"$W/coloc1.log" 2>&1
say "ours coloc1 rc=$?"; tail -3 "$W/coloc1.log"
cp "$W/coloc1/metrics.jsonl" "$OUT/metrics_moe_coloc1.jsonl" 2>/dev/null
python3 - "$W/coloc1/metrics.jsonl" "$OUT/torch_moe_pipeline.log" <<'PY' | tee -a "$OUT/summary.txt"
import json, re, sys
m = [json.loads(l) for l in open(sys.argv[1])] if sys.argv[1] else []
st = m[3:] if len(m) > 5 else m
ours = sum(r["target_tokens"] for r in st) / sum(r["step_s"] for r in st) if st else float("nan")
mem = {k: v / 2**30 for k, v in (st[-1].get("peak_mem_bytes", {}) if st else {}).items()}
t = {}
for l in open(sys.argv[2]):
    if l.startswith("RESULT") and "pipeline_coloc1" in l:
        t = dict(re.findall(r'(\w+)=(\S+)', l))
tt = float(t.get("ctx_tok_s", "nan"))
print(f"MoE co-located on 1 GPU: ours {ours:.0f} ctx tok/s (peak GiB {mem}), torch {tt:.0f} ctx tok/s "
      f"(peak {t.get('peak_gib_gpu0', '?')} GiB), ratio {ours / tt:.2f} (goal >= 1.5)")
PY
say "done"
