#!/usr/bin/env bash
# bench/zero1_check.sh — the sharded optimizer (ZeRO-1, --shard-optimizer) on 2 GPUs in one device call: the NCCL
# reduce-scatter / all-gather path that the CPU machine cannot run. Run from the repo root on an nvidia-h200-x2
# machine with $OUT set (carry .deps when the image lacks PCRE2's dev files, tools/device_env.sh):
#   OUT=... bash bench/zero1_check.sh   env: STEPS (default 40), Q8_STEPS (default 6), REPEAT (default 6), TORCH_REF=1
#   (the PyTorch step's peak memory measured in the same run), SKIP_DEMO=1 (only part 2)
# 1. demo target and data, co-located on cuda:0,1: sharded vs replicated, same 40 steps: loss curves (expect max
#    rel diff ~1e-3 or less: the grad norm's summation order differs, bf16 compute copies amplify it), peak memory
#    per drafter; a sharded run stopped at step 20 and resumed on 1 GPU (the checkpoint re-split) ends near both;
# 2. Qwen3-8B shapes with random weights, 5 draft layers, --recompute, 2 drafters: peak memory per drafter sharded vs
#    replicated (expected saving 4 bytes per parameter, ~3.9 GiB at 1.05e9 parameters).
# Files back in $OUT: summary.txt, metrics_*.jsonl, logs.tgz.
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
W=$(mktemp -d)
STEPS=${STEPS:-40}
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
. tools/device_env.sh
cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1 || { say "configure FAILED"; tail -30 "$W/configure.log"; }
timeout 400 cmake --build build-cuda -j 28 --target dflash >"$W/build.log" 2>&1
say "build rc=$?"; grep -E "error" "$W/build.log" | head -20
B=build-cuda/dflash

if [ "${SKIP_DEMO:-0}" != 1 ]; then
# 1. demo: sharded vs replicated vs resumed across the drafter count
$B prepare --tokenizer assets/demo/target --input assets/demo/train.jsonl.gz --out "$W/demo_data" --max-length 512 >"$W/prep_demo.log" 2>&1
DEMO="--target assets/demo/target --data $W/demo_data --num-layers 2 --block-size 16 --batch-size 16 --max-steps $STEPS --lr 6e-4 --quiet --no-export --collective-timeout 60"
run() {  # name, args...
  local name=$1; shift
  timeout 120 $B train $DEMO --out "$W/$name" "$@" >"$W/$name.log" 2>&1
  local rc=$?; say "$name rc=$rc"; [ $rc = 0 ] || tail -5 "$W/$name.log" | tee -a "$OUT/summary.txt"
  cp "$W/$name/metrics.jsonl" "$OUT/metrics_$name.jsonl" 2>/dev/null
}
run replicated --device cuda --colocate --drafters 0,1 --no-shard-optimizer
run sharded --device cuda --colocate --drafters 0,1 --shard-optimizer
run resumed --device cuda --colocate --drafters 0,1 --stop-after $((STEPS / 2))
if [ -f "$W/resumed/checkpoints/LATEST" ]; then run resumed --device cuda:0 --resume
else say "resumed: the stop-after run left no checkpoint: no resume comparison"; rm -f "$W/resumed/metrics.jsonl"; fi
# the NCCL launch rule (backend/collective.h): the co-located 2-GPU run once hung in its first reduce-scatter;
# REPEAT short runs of each layout, every one must end (a hang fails after --collective-timeout 60)
for i in $(seq 1 "${REPEAT:-6}"); do
  for mode in --shard-optimizer --no-shard-optimizer; do
    timeout 120 $B train ${DEMO/--max-steps $STEPS/--max-steps 8} --out "$W/rep$i$mode" --device cuda --colocate --drafters 0,1 $mode \
      >"$W/rep$i$mode.log" 2>&1 || say "repeat $i $mode FAILED: $(grep -m1 error "$W/rep$i$mode.log")"
  done
done
say "repeats done (${REPEAT:-6} x 2 layouts)"
python3 - "$W" <<'PY' | tee -a "$OUT/summary.txt"
import json, os, sys
W = sys.argv[1]
def m(n):
    p = os.path.join(W, n, "metrics.jsonl")
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
r, s, q = m("replicated"), m("sharded"), m("resumed")
def diff(a, b):
    d = [abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b) if x.get("loss") and y.get("loss")]
    return f"{len(d)} steps, max rel diff {max(d):.2e}" if d else "n/a"
print("sharded vs replicated:", diff(r, s), "| resumed (2 sharded -> 1) vs sharded:", diff(s, q))
for n, x in (("replicated", r), ("sharded", s)):
    if x: print(f"{n}: loss {x[0]['loss']:.4f} -> {x[-1]['loss']:.4f}; peak GiB per worker",
                {k.split(' (')[0]: round(v / 2**30, 2) for k, v in x[-1].get("peak_mem_bytes", {}).items()})
PY
fi

# 2. Qwen3-8B shapes, random weights: the memory the sharding saves per drafter; with TORCH_REF=1 first the PyTorch
#    recompute step of the same shapes per drafter (bench/torch_ref.py --part step --modes ckpt: 4 sequences, S 3072,
#    512 anchors x 16, 5 layers, AdamW, per-layer checkpointing) on cuda:0 alone, for the issue-13 memory ratio
if [ "${TORCH_REF:-0}" = 1 ]; then
  CD=$(mktemp -d)
  CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=$CD/i TRITON_CACHE_DIR=$CD/t timeout 240 python3 bench/torch_ref.py \
    --part step --modes ckpt >"$W/torch_step.log" 2>&1
  say "torch step rc=$?: $(grep -m1 'name=step_recompute' "$W/torch_step.log")"
fi
mkdir -p "$W/q8"
python3 bench/q8_data.py "$W/q8/config.json" "$W/rows.jsonl" 48
$B prepare --tokenizer assets/demo/target --input "$W/rows.jsonl" --out "$W/q8data" >"$W/prep_q8.log" 2>&1 || tail -5 "$W/prep_q8.log"
# --loss decay: the PyTorch step of bench/torch_ref.py weights the loss by the decay (gamma 7)
Q8="--target $W/q8 --random-target --data $W/q8data --mask-token-id 151669 --num-layers 5 --block-size 16 --max-anchors 512 --loss decay --max-steps ${Q8_STEPS:-6} --batch-size 8 --recompute --quiet --no-export --checkpoint-every 0 --device cuda --colocate --drafters 0,1"
for mode in --no-shard-optimizer --shard-optimizer; do
  timeout 150 $B train $Q8 --out "$W/q8$mode" $mode >"$W/q8$mode.log" 2>&1
  say "q8 $mode rc=$? peak GiB: $(python3 -c "import json,sys; m=[json.loads(l) for l in open('$W/q8$mode/metrics.jsonl')]; print({k: round(v/2**30,2) for k,v in m[-1].get('peak_mem_bytes',{}).items()})" 2>&1)"
  cp "$W/q8$mode/metrics.jsonl" "$OUT/metrics_q8$mode.jsonl" 2>/dev/null
done
if [ "${TORCH_REF:-0}" = 1 ]; then
  python3 - "$W" <<'PY' | tee -a "$OUT/summary.txt"
import json, re, sys
W = sys.argv[1]
t = re.search(r"name=step_recompute .*?peak_gib=([0-9.]+)", open(f"{W}/torch_step.log").read())
m = [json.loads(l) for l in open(f"{W}/q8--shard-optimizer/metrics.jsonl")]
ours = max(v for k, v in m[-1]["peak_mem_bytes"].items() if k.startswith("drafter")) / 2**30
if t:
    print(f"peak per drafter GPU: ours (2 drafters, sharded) {ours:.2f} GiB vs PyTorch step {float(t.group(1)):.2f} GiB"
          f" = {ours / float(t.group(1)):.3f}x (issue 13: <= 0.6x)")
PY
fi
tar czf "$OUT/logs.tgz" -C "$W" $(cd "$W" && ls *.log 2>/dev/null) 2>/dev/null
say "done"
