#!/usr/bin/env bash
# tools/split_check.sh — the split target (train --target-split, issue 55) on one GPU of the GPU machine, from the repo
# root, in one device call after tools/fp8_check.sh STEP=build (or any build of dflash in build-cuda):
#   1. the demo target and data, 30 steps co-located on cuda:0 with the target whole (S = 1) and in 2 and 3 stages on
#      the same device: the loss curves must be equal (the stages run forward's ops in its order: bit for bit);
#   2. Qwen3-8B shapes with random weights (dflash train --random-target, S 3072, 512 anchors x 16, 4 sequences per
#      step, bench/q8_data.py), S = 1 against S = 2 on the same device: the split's overhead in context tokens / s;
#   3. `dflash info --plan` of both layouts beside the peak memory the runs measured.
# Logs in $OUT (default build-cuda/split_check); the last lines printed are the table.
set -u
T0=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build-cuda/split_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d)
B=${BUILD:-build-cuda}/dflash
STEPS=${STEPS:-10}
say() { echo "[split_check +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
source tools/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"

# 1. equal curves
$B prepare --tokenizer assets/demo/target --input assets/demo/train.jsonl.gz --out "$W/demo_data" --max-length 512 \
  >"$OUT/prep_demo.log" 2>&1
for S in 1 2 3; do
  timeout 120 $B train --target assets/demo/target --data "$W/demo_data" --out "$W/curve$S" --device cuda:0 \
    --target-split $S --num-layers 2 --block-size 16 --batch-size 16 --max-steps 30 --lr 6e-4 --quiet --no-export \
    >"$OUT/curve$S.log" 2>&1
  say "demo curve, $S stage(s) rc=$?"
done
python3 - "$W" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
W = sys.argv[1]
m = {S: [json.loads(l) for l in open(f"{W}/curve{S}/metrics.jsonl")] for S in (1, 2, 3)}
for S in (2, 3):
    same = len(m[S]) == len(m[1]) and all(a["loss"] == b["loss"] for a, b in zip(m[1], m[S]))
    d = max(abs(a["loss"] - b["loss"]) for a, b in zip(m[1], m[S])) if m[S] else float("nan")
    print(f"S={S} vs S=1: {len(m[S])} steps, loss curves {'equal' if same else 'DIFFER'} (max |diff| {d:.3e})")
PY

# 2. the overhead at Qwen3-8B shapes
mkdir -p "$W/q8"
python3 bench/q8_data.py "$W/q8/config.json" "$W/rows.jsonl" 96
$B prepare --tokenizer assets/demo/target --input "$W/rows.jsonl" --out "$W/q8data" >"$OUT/prep_q8.log" 2>&1
LAYOUT="--target $W/q8 --data $W/q8data --num-layers 5 --block-size 16 --max-anchors 512 --batch-size 4 --device cuda:0"
COMMON="$LAYOUT --random-target --mask-token-id 151669 --max-steps $STEPS --quiet --no-export --checkpoint-every 0"
for S in 1 2; do
  timeout 150 $B train $COMMON --target-split $S --out "$W/q8_s$S" >"$OUT/q8_s$S.log" 2>&1
  say "Qwen3-8B shapes, $S stage(s) rc=$?"
  cp "$W/q8_s$S/metrics.jsonl" "$OUT/metrics_q8_s$S.jsonl" 2>/dev/null
  $B info --plan $LAYOUT --target-split $S >"$OUT/plan_s$S.txt" 2>&1
done
python3 - "$W" <<'PY' | tee -a "$OUT/summary.txt"
import json, os, sys
W = sys.argv[1]
for S in (1, 2):
    p = f"{W}/q8_s{S}/metrics.jsonl"
    if not os.path.exists(p):
        print(f"S={S}: no run"); continue
    m = [json.loads(l) for l in open(p)]
    st = m[3:] if len(m) > 5 else m
    tok = sum(r["target_tokens"] for r in st) / sum(r["step_s"] for r in st)
    mem = {k: round(v / 2**30, 2) for k, v in st[-1].get("peak_mem_bytes", {}).items()}
    print(f"S={S}: {tok:.0f} context tokens/s over steps {len(m) - len(st) + 1}..{len(m)}; peak GiB {mem}")
PY
tail -n 4 "$OUT"/plan_s*.txt
say "done"
