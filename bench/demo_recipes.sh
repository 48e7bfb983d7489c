#!/usr/bin/env bash
# bench/demo_recipes.sh — training recipes for the CPU demo side by side (issue 14): each recipe trains a drafter
# on the demo target and data with 2 CPU threads pinned to its own 2 cores (taskset), as many recipes at a time as
# the machine has core pairs, then measures teacher-forced tau on the demo eval set. Same data, same seed.
# Usage: OUT=dir bash bench/demo_recipes.sh RECIPES_FILE
#   RECIPES_FILE: one recipe per line, "name|dflash train options" (lines starting with # are skipped); the
#   options replace those of the demo's CPU base below.
#   env: DEVICE (cpu, default: 2 pinned cores per recipe; cuda: the GPU demo's base, one recipe per GPU at a time),
#        KEEP_RUNS=1 keeps checkpoints, exports and the prepared data; BIN (default build-cpu/dflash, built here when missing), STEPS (--max-steps, default 250; 0 = use
#        BUDGET), BUDGET (--time-budget seconds when STEPS=0, default 360), EVAL_N (default 100).
# Writes $OUT/<name>/ (run, eval.json, logs) and prints a table: recipe, steps, train s, s/step, EAL, tau.
set -u
: "${OUT:?set OUT}"
RECIPES=${1:?give a recipes file}
cd "$(dirname "$0")/.." || exit 1
STEPS=${STEPS:-250} BUDGET=${BUDGET:-360} EVAL_N=${EVAL_N:-100}
BIN=${BIN:-build-cpu/dflash}
. tools/device_env.sh  # PCRE2 from .deps on the GPU machine
if [ ! -x "$BIN" ]; then
  cmake -S . -B build-cpu -DDFLASH_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null && \
    cmake --build build-cpu -j "$(nproc)" --target dflash >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
T=assets/demo/target
D=$OUT/data
[ -f "$D/train/manifest.json" ] || "$BIN" prepare --tokenizer $T --input assets/demo/train.jsonl.gz --out "$D/train" \
  --format raw --max-length 1024 >/dev/null
[ -f "$D/eval/manifest.json" ] || "$BIN" prepare --tokenizer $T --input assets/demo/eval.jsonl.gz --out "$D/eval" \
  --format raw --max-length 1024 >/dev/null
# the demo's recipes (src/cli/cmd_demo.cpp), with the decayed cross-entropy they were tuned with (--loss decay);
# DEVICE=cuda runs recipe i on GPU i mod (number of GPUs), one at a time per GPU
DEVICE=${DEVICE:-cpu}
if [ "$DEVICE" = cpu ]; then
  BASE="--target $T --data $D/train --num-layers 1 --block-size 16 --max-anchors 32 --batch-size 8 --loss decay --gamma 2 --lr 3e-3
        --epochs 6 --seed 0 --threads 2 --quiet --checkpoint-every 0"
  pairs=$(( $(nproc) / 2 ))
else
  BASE="--target $T --data $D/train --num-layers 3 --block-size 16 --max-anchors 128 --batch-size 32 --loss decay --gamma 2 --lr 2e-3
        --epochs 12 --seed 0 --quiet --checkpoint-every 0"
  pairs=$(nvidia-smi -L | wc -l)
fi
if [ "$STEPS" -gt 0 ]; then LEN="--max-steps $STEPS"; else LEN="--time-budget $BUDGET"; fi

one() {  # name cores options...
  local name=$1 cores=$2; shift 2
  local R=$OUT/$name
  mkdir -p "$R"
  local t0=$(date +%s.%N)
  # the base options the recipe does not set (CLI11 refuses an option given twice)
  local base=() a=($BASE) k
  for ((k = 0; k < ${#a[@]}; k += 2)); do
    case " $* " in *" ${a[k]} "*) ;; *) base+=("${a[k]}"); [[ ${a[k + 1]:-} == --* ]] && k=$((k - 1)) || base+=("${a[k + 1]}") ;; esac
  done
  local pin=(taskset -c "$cores") dev=()
  [ "$DEVICE" = cpu ] || { pin=(); dev=(--device "cuda:$cores"); }
  "${pin[@]}" "$BIN" train "${base[@]}" "${dev[@]}" $LEN "$@" --out "$R/run" --overwrite >"$R/train.log" 2>&1 || { echo "train rc=$?" >>"$R/train.log"; }
  local t1=$(date +%s.%N)
  "${pin[@]}" "$BIN" eval --target $T --drafter "$R/run/export" --data "$D/eval" --mode teacher "${dev[@]}" \
    --max-samples "$EVAL_N" --no-progress --json "$R/eval.json" >"$R/eval.log" 2>&1
  echo "$t0 $t1" >"$R/wall.txt"
}

[ "$pairs" -ge 1 ] || pairs=1
i=0
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  name=${line%%|*}; opts=${line#*|}
  c=$(( (i % pairs) * 2 ))
  slot="$c,$((c + 1))"
  [ "$DEVICE" = cpu ] || slot=$((i % pairs))
  # shellcheck disable=SC2086
  one "$name" "$slot" $opts </dev/null &
  i=$((i + 1))
  [ $((i % pairs)) -eq 0 ] && wait
done <"$RECIPES"
wait
[ "${KEEP_RUNS:-0}" = 1 ] || rm -rf "$OUT"/*/run/checkpoints "$OUT"/*/run/export "$OUT/data"  # keep metrics, logs

printf '%-28s %6s %8s %7s %6s %6s\n' recipe steps train_s s/step EAL tau | tee "$OUT/table.txt"
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  name=${line%%|*}
  python3 - "$OUT/$name" "$name" <<'EOF' | tee -a "$OUT/table.txt"
import json, sys, os
r, name = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(os.path.join(r, "run/metrics.jsonl"))] if os.path.exists(os.path.join(r, "run/metrics.jsonl")) else []
tau = "-"
try:
    tau = "%.3f" % json.load(open(os.path.join(r, "eval.json")))["teacher_forced"]["tau"]
except Exception:
    pass
t0, t1 = (float(x) for x in open(os.path.join(r, "wall.txt")).read().split())
steps = rows[-1]["step"] if rows else 0
eal = sum(x.get("eal", 0) for x in rows[-20:]) / max(1, len(rows[-20:]))
print("%-28s %6d %8.0f %7.2f %6.3f %6s" % (name, steps, t1 - t0, (t1 - t0) / max(1, steps), eal, tau))
EOF
done <"$RECIPES"
