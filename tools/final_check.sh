#!/usr/bin/env bash
# tools/final_check.sh — a short GPU check of main (repo root, $OUT set, carry .deps): build, the whole CUDA op table,
# and a short training run on cuda:0 with the tiny dense and the tiny MoE golden targets (the trainer's phases, the run
# lock, a checkpoint and a resume on the GPU).
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
. tools/device_env.sh
W=$(mktemp -d)
cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1
cmake --build build-cuda -j 15 --target dflash_cuda_tests dflash >"$W/build.log" 2>&1 || { say "build FAILED"; grep error "$W/build.log" | head; exit 1; }
say built
timeout 240 build-cuda/dflash_cuda_tests >"$OUT/cuda_tests.log" 2>&1
say "op table rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_tests.log" | tr '\n' ' ') $(grep -E 'checks failed' "$OUT/cuda_tests.log")"
B=build-cuda/dflash
python3 - "$W/tiny.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for s in range(24):
        k, x = 1 + r.randrange(3), r.randrange(64)
        f.write(json.dumps({"input_ids": [(x + k * p) % 64 for p in range(40)], "loss_mask": [int(p >= 6) for p in range(40)]}) + "\n")
PY
$B prepare --tokenizer assets/demo/target --input "$W/tiny.jsonl" --out "$W/data" >"$W/prep.log" 2>&1 || tail -3 "$W/prep.log"
for t in target_qwen3 target_qwen3_moe; do
  A="--target tests/golden/$t --data $W/data --device cuda:0 --num-layers 1 --block-size 4 --target-layer-ids 1,2 --mask-token-id 511 --max-anchors 8 --batch-size 2 --lr 1e-2 --seed 3 --quiet --checkpoint-every 20"
  timeout 60 $B train $A --out "$W/$t" --max-steps 40 >"$W/$t.log" 2>&1; r1=$?
  timeout 60 $B train $A --out "$W/$t" --max-steps 60 --resume >>"$W/$t.log" 2>&1; r2=$?
  say "$t on cuda: train rc=$r1, resume to 60 rc=$r2, $(python3 -c "import json,sys; m=[json.loads(l) for l in open(sys.argv[1])]; print(len(m), 'steps, loss', round(m[0]['loss'],4), '->', round(m[-1]['loss'],4))" "$W/$t/metrics.jsonl" 2>&1)"
done
tail -5 "$W/target_qwen3_moe.log"
sed -n '/^==== CUDA backend checks/,/checks failed ====/p' "$OUT/cuda_tests.log" | grep -E "FAIL|====" | head
say done
