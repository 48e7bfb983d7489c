#!/usr/bin/env bash
# bench/dpace_demo.sh — the training objectives on the GPU demo (issue: D-PACE beside the decayed cross-entropy):
# 3 objectives x 3 seeds of `dflash demo --device cuda` at the demo's defaults (8 layers, B 16, 360 s budget), then
# a table (tau teacher-forced and by speculative decoding, per-slot acceptance, the default the numbers support:
# bench/dpace_table.py) and one plot of the runs (`dflash plot`: training curves, per-slot accuracy along the block).
#   decay     --loss decay (the paper's: spec 2.4, the demo's gamma 2; the default until this table chose dpace)
#   dpace     --loss dpace (D-PACE, alpha 0.5; the default since 2026-12-07)
#   dpace_kl  --loss dpace --kl-weight $KL (dearer: the target's logits per supervised row)
# One run per GPU at a time (GPU g runs its runs with CUDA_VISIBLE_DEVICES=g), seed by seed, the objectives of a seed
# side by side (GPUS defaults to a multiple of the objective count). A GPU demo run takes ~6.5 min (360 s of training,
# ~25-40 s of preparing and eval; bench/RESULTS.md: 384-399 s wall): 9 runs are ~60 GPU-minutes; on 3 GPUs 3 rounds
# (~20 min), on 6 or more GPUs 2 rounds (~13 min).
# A finished run (its summary.json) is never run again and an interrupted one continues (`demo --resume`), so when a
# call hits a time limit, call the script again: it picks up where it stopped. The table covers what is finished.
#
# Usage: bash bench/dpace_demo.sh                 (on the GPU machine; builds build-cuda/dflash when missing)
#        bash bench/dpace_demo.sh --table-only    (table and plot from ROOT's finished runs: also here, on the CPU)
# env: DEVICE (cuda, the default, or cpu: the CPU demo, one run at a time on all cores; its ROOT, KEPT and BIN
#      defaults end in _cpu / build-cpu), ROOT (default runs/dpace_demo), SEEDS ("0 1 2"), OBJECTIVES ("decay dpace dpace_kl"), KL (0.15),
#      GPUS (runs at once; default: the GPUs nvidia-smi lists), MAX_RUNS (at most this many runs in this call, the
#      first missing ones in seed order: MAX_RUNS=1 fits one run in a 10-minute device call), BIN (default
#      build-cuda/dflash, built when missing; a path ending in .xz is a binary built here by tools/carry_build.sh and
#      carried: unpacked and used when it runs there, else the script builds; --table-only: build-cpu/dflash when there
#      is no CUDA build), DEMO_ARGS (extra `dflash demo` options, e.g. "--budget 120" for a
#      quick look; default none = the demo's defaults), KEPT (finished runs kept in the repository, default
#      bench/dpace_runs, bench/dpace_runs_<card> on a card other than the H100 80GB HBM3 (below), or
#      bench/dpace_runs_cpu: copied into ROOT, not run again), OUT (if set: table.md, the TSV, the plots, and
#      dpace_runs.tar.gz with every finished run's summary.json, demo.log and thinned run/metrics.jsonl in KEPT's
#      layout: unpacked into KEPT and committed, the runs of several calls and sessions make one table).
# Prints the compact table last.
# On the lent machines (10 minutes a call): 6 GPUs run seeds 0 and 1 in ~7 min (SEEDS="0 1"), a second call seed 2
# (SEEDS=2) and then the table of whatever ROOT holds; or one seed per call on 3 GPUs. On one GPU, one run a call,
# with the binary built here (`bash tools/carry_build.sh`; carry [".deps", "build-cudacarry/dflash.xz"]):
#   OUT=$OUT MAX_RUNS=1 BIN=build-cudacarry/dflash.xz bash bench/dpace_demo.sh
# then here: tar xzf <files_at>/dpace_runs.tar.gz -C <the KEPT it printed>, and commit.
set -u
cd "$(dirname "$0")/.." || exit 1
DEVICE=${DEVICE:-cuda}
case "$DEVICE" in
  cuda) SUFFIX= ;;
  cpu) SUFFIX=_cpu; GPUS=1 ;;  # the CPU demo takes every core: one run at a time
  *) echo "dpace_demo.sh: DEVICE is cuda or cpu, not '$DEVICE'" >&2; exit 2 ;;
esac
ROOT=${ROOT:-runs/dpace_demo$SUFFIX}
SEEDS=${SEEDS:-0 1 2}
OBJECTIVES=${OBJECTIVES:-decay dpace dpace_kl}
KL=${KL:-0.15}
TABLE_ONLY=0
[ "${1:-}" = --table-only ] && TABLE_ONLY=1
mkdir -p "$ROOT"
# runs finished in earlier device calls or sessions, kept in the repository (KEPT, default bench/dpace_runs: each
# run's summary.json, demo.log and run/metrics.jsonl, as OUT/dpace_runs.tar.gz brings them back): copied into ROOT
# where ROOT lacks the run, so that they are not run again and the table covers them
# The demo trains for a fixed time, so the step count depends on the card: the kept GPU runs are one card's set,
# bench/dpace_runs for the H100 80GB HBM3 that ran the first ones; another card keeps its own set in
# bench/dpace_runs_<card> (e.g. bench/dpace_runs_h200), so that one table never mixes cards.
if [ -z "${KEPT:-}" ] && [ "$DEVICE" = cuda ] && [ "$TABLE_ONLY" = 0 ]; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | tr 'A-Z' 'a-z' |
         sed 's/^nvidia //; s/[^a-z0-9]\+/_/g; s/_$//')
  case "$card" in
    ""|h100_80gb_hbm3) ;;
    *) KEPT=bench/dpace_runs_$card ;;
  esac
fi
KEPT=${KEPT:-bench/dpace_runs$SUFFIX}
if [ -d "$KEPT" ]; then
  for d in "$KEPT"/*-s*/; do
    [ -f "$d/summary.json" ] || continue
    n=$(basename "$d")
    [ -f "$ROOT/$n/summary.json" ] && continue
    mkdir -p "$ROOT/$n/run"
    cp "$d/summary.json" "$ROOT/$n/"
    [ -f "$d/demo.log" ] && cp "$d/demo.log" "$ROOT/$n/"
    [ -f "$d/run/metrics.jsonl" ] && cp "$d/run/metrics.jsonl" "$ROOT/$n/run/"
    echo "dpace_demo: $n kept from $KEPT"
  done
fi
[ -f tools/device_env.sh ] && . tools/device_env.sh  # PCRE2 from .deps on the GPU machine

objective_args() {
  case "$1" in
    decay) echo "--loss decay" ;;
    dpace) echo "--loss dpace" ;;
    dpace_kl) echo "--loss dpace --kl-weight $KL" ;;
    *) echo "dpace_demo.sh: unknown objective '$1' (decay, dpace, dpace_kl)" >&2; return 1 ;;
  esac
}

thin_metrics() {  # metrics.jsonl -> every 10th step and the last, each with the step_s of the steps it stands for
  python3 - "$1" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
acc = 0.0
for i, l in enumerate(lines):
    j = json.loads(l)
    acc += j.get("step_s", 0.0)
    if i % 10 == 9 or i == len(lines) - 1:
        j["step_s"] = acc
        acc = 0.0
        print(json.dumps(j, separators=(",", ":")))
PY
}

if [ "$TABLE_ONLY" = 0 ]; then
  B=build-cuda CUDA_FLAG=ON
  [ "$DEVICE" = cpu ] && B=build-cpu CUDA_FLAG=OFF
  BIN=${BIN:-$B/dflash}
  if [ "${BIN%.xz}" != "$BIN" ]; then  # a binary built on another machine (tools/carry_build.sh), xz-compressed
    XZ=$BIN BIN=$B/dflash
    if python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
         "$XZ" "$ROOT/dflash" && chmod +x "$ROOT/dflash" && "$ROOT/dflash" --help >/dev/null 2>&1; then
      BIN=$ROOT/dflash
      echo "dpace_demo: running the carried $XZ"
    else
      echo "dpace_demo: the carried $XZ does not run here ($(ldd "$ROOT/dflash" 2>&1 | grep -m1 'not found')); building"
    fi
  fi
  if [ ! -x "$BIN" ]; then
    echo "building $BIN ..."
    cmake -S . -B "$B" -DDFLASH_CUDA=$CUDA_FLAG -DCMAKE_BUILD_TYPE=Release >"$ROOT/configure.log" 2>&1 &&
      cmake --build "$B" -j "$(nproc)" --target dflash >"$ROOT/build.log" 2>&1 ||
      { tail -30 "$ROOT/configure.log" "$ROOT/build.log" 2>/dev/null; exit 1; }
  fi
  n_obj=$(echo $OBJECTIVES | wc -w)
  if [ -z "${GPUS:-}" ]; then  # a multiple of the objective count, so that each round runs whole seeds side by side
    GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
    [ "$GPUS" -ge "$n_obj" ] && GPUS=$(( GPUS / n_obj * n_obj ))
  fi
  [ "$GPUS" -ge 1 ] || { echo "dpace_demo.sh: no GPU (nvidia-smi lists none); --table-only makes the table" >&2; exit 1; }
  # the runs still to do, seed by seed (the objectives of one seed run at the same time, under the same load)
  todo=()
  for o in $OBJECTIVES; do objective_args "$o" >/dev/null || exit 2; done
  for s in $SEEDS; do
    for o in $OBJECTIVES; do [ -f "$ROOT/$o-s$s/summary.json" ] || todo+=("$o:$s"); done
  done
  if [ -n "${MAX_RUNS:-}" ] && [ "${#todo[@]}" -gt "$MAX_RUNS" ]; then  # the first MAX_RUNS of them in this call
    todo=("${todo[@]:0:$MAX_RUNS}")
  fi
  where="on $GPUS GPU(s)"
  [ "$DEVICE" = cpu ] && where="on the CPU, one at a time"
  echo "dpace_demo: ${#todo[@]} run(s) to do $where: ${todo[*]:-none} (kept runs: $KEPT)"
  run_one() {  # gpu objective seed
    local g=$1 o=$2 s=$3 dir=$ROOT/$2-s$3 resume=()
    [ -d "$dir/run" ] && resume=(--resume)  # an interrupted run continues (its time budget too)
    mkdir -p "$dir"
    local t0=$SECONDS
    # shellcheck disable=SC2046,SC2086
    CUDA_VISIBLE_DEVICES=$g "$BIN" demo --device "$DEVICE" --out "$dir" --seed "$s" $(objective_args "$o") $DEMO_ARGS \
      "${resume[@]}" >>"$dir/demo.log" 2>&1
    local rc=$?
    echo "  $o seed $s on $([ "$DEVICE" = cuda ] && echo "GPU $g" || echo cpu): rc $rc, $((SECONDS - t0)) s$([ $rc = 0 ] || echo " (see $dir/demo.log)")"
  }
  DEMO_ARGS=${DEMO_ARGS:-}
  i=0
  for item in "${todo[@]}"; do
    run_one $((i % GPUS)) "${item%%:*}" "${item##*:}" </dev/null &
    i=$((i + 1))
    [ $((i % GPUS)) -eq 0 ] && wait
  done
  wait
else
  BIN=${BIN:-build-cuda/dflash}
  [ -x "$BIN" ] || BIN=build-cpu/dflash
fi

# the table, then the plot of every finished run's training (per-slot accuracy along the block among the panels)
python3 bench/dpace_table.py "$ROOT" >"$ROOT/table.txt" 2>&1
runs=()  # relative to ROOT, so that the legend reads "dpace-s1/run"
for o in $OBJECTIVES; do for s in $SEEDS; do [ -f "$ROOT/$o-s$s/run/metrics.jsonl" ] && runs+=("$o-s$s/run"); done; done
BIN=$(realpath "$BIN")
: >"$ROOT/plot.log"
if [ ${#runs[@]} -gt 0 ]; then
  (cd "$ROOT" && "$BIN" plot "${runs[@]}" --out dpace_demo.png --x seconds >>plot.log 2>&1) ||
    echo "plot failed (gnuplot missing on this machine? run: bash bench/dpace_demo.sh --table-only where it is)" \
      "- $(tail -1 "$ROOT/plot.log")"
fi
# the eval's acceptance along the block, per objective (mean over seeds): bench/dpace_table.py's gnuplot script
if command -v gnuplot >/dev/null && [ -s "$ROOT/acceptance_by_slot.gp" ]; then
  gnuplot "$ROOT/acceptance_by_slot.gp" >>"$ROOT/plot.log" 2>&1 ||
    echo "acceptance plot failed: $(tail -1 "$ROOT/plot.log")"
fi
if [ -n "${OUT:-}" ]; then
  # a device call brings back at most 8 files, 2 folders down: the table and plots, and every run finished here (not
  # those kept from KEPT) in one archive in KEPT's layout (<run>/summary.json, demo.log, run/metrics.jsonl), to
  # unpack into KEPT and commit: `tar xzf $OUT/dpace_runs.tar.gz -C <KEPT as printed above>`. metrics.jsonl is
  # thinned to every 10th step (step_s summed over the steps it stands for, so that `dflash plot --x seconds` keeps
  # its time axis; 2.5 MB -> 0.25 MB a run)
  cp "$ROOT"/table.md "$ROOT"/table.txt "$ROOT"/acceptance_by_slot.tsv "$ROOT"/*.png "$OUT"/ 2>/dev/null
  K=$(mktemp -d)
  for d in "$ROOT"/*-s*/; do
    n=$(basename "$d")
    [ -f "$d/summary.json" ] && [ ! -f "$KEPT/$n/summary.json" ] || continue
    mkdir -p "$K/$n/run"
    cp "$d"summary.json "$K/$n/"
    cp "$d"demo.log "$K/$n/" 2>/dev/null
    [ -f "$d/run/metrics.jsonl" ] && thin_metrics "$d/run/metrics.jsonl" >"$K/$n/run/metrics.jsonl"
  done
  tar czf "$OUT/dpace_runs.tar.gz" -C "$K" .
  rm -rf "$K"
fi
echo
cat "$ROOT/table.txt"
