#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, with $OUT set:   bash tools/device_build_assets.sh
#   (A) tools/make_goldens.py        -> tests/golden/      packed at once into $OUT/golden.tar.gz.part-NN
#   (B) tools/demo/build_target.py   -> assets/demo/       packed into $OUT/demo.tar.gz.part-NN
# Pieces are at most 15 MB; $OUT also gets log_goldens.txt, log_demo.txt and summary.txt (with the sha256 of
# each whole archive). Unpack here with: bash tools/unpack_device_outputs.sh <folder holding the pieces>
# A failure in (B) never loses (A): (A) is packed before (B) starts.
# Env: DEVICE_TOTAL_S (default 570: the whole script ends by then), TRAIN_BUDGET_S (default 360),
#      GOLDEN_TIMEOUT_S (default 240), PYTHON (default python3), DEMO_ARGS (extra build_target.py arguments).
set -u
T0=$(date +%s)
: "${OUT:?set OUT to the output folder}"
TOTAL=${DEVICE_TOTAL_S:-570}
BUDGET=${TRAIN_BUDGET_S:-360}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true PYTHONDONTWRITEBYTECODE=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 1
LOGA="$OUT/log_goldens.txt"
LOGB="$OUT/log_demo.txt"
SUM="$OUT/summary.txt"
TMP=$(mktemp -d)
: >"$SUM"

say() { echo "$*" | tee -a "$SUM"; }

pack() {  # pack NAME PATH : tar.gz of PATH split into 15 MB pieces under $OUT, sha256 into the summary
  local name=$1 path=$2
  if [ ! -e "$path" ]; then say "pack $name: $path missing"; return 1; fi
  chmod -R a+rX "$path" 2>/dev/null  # save_pretrained may write 0600 files
  tar -czf "$TMP/$name.tar.gz" "$path" || { say "pack $name: tar failed"; return 1; }
  split -b 15M -d -a 2 "$TMP/$name.tar.gz" "$OUT/$name.tar.gz.part-"
  say "sha256 $name.tar.gz $(sha256sum "$TMP/$name.tar.gz" | cut -d' ' -f1) $(stat -c %s "$TMP/$name.tar.gz")"
}

say "device_build_assets: start $(date -u '+%F %T') UTC total=${TOTAL}s train_budget=${BUDGET}s"
"$PY" - >>"$SUM" 2>&1 <<'EOF' || true
import sys, torch, transformers, tokenizers, safetensors, numpy
print("versions: python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__, "numpy", numpy.__version__,
      "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))
EOF
tail -n 1 "$SUM"

# ---- (A) goldens
TA=$(date +%s)
timeout "${GOLDEN_TIMEOUT_S:-240}" "$PY" tools/make_goldens.py --out tests/golden >"$LOGA" 2>&1
RC_A=$?
say "(A) make_goldens rc=$RC_A in $(( $(date +%s) - TA ))s"
pack golden tests/golden

# ---- (B) demo target
TB=$(date +%s)
DEADLINE=$(( T0 + TOTAL - 15 ))
LEFT=$(( DEADLINE - TB ))
if [ "$LEFT" -gt 60 ]; then
  # shellcheck disable=SC2086
  timeout "$(( LEFT + 5 ))" $PY tools/demo/build_target.py --out assets/demo --budget "$BUDGET" \
    --deadline "$DEADLINE" ${DEMO_ARGS:-} >"$LOGB" 2>&1
  RC_B=$?
else
  echo "not started: only ${LEFT}s left" >"$LOGB"
  RC_B=99
fi
say "(B) build_target rc=$RC_B in $(( $(date +%s) - TB ))s"
pack demo assets/demo
rm -rf "$TMP"

# ---- short report (full logs in $OUT)
{
  echo "---- summary lines"
  grep -h '^SUMMARY' "$LOGA" "$LOGB" 2>/dev/null
  if [ "$RC_A" -ne 0 ]; then echo "---- tail of log_goldens.txt"; tail -n 15 "$LOGA"; fi
  if [ "$RC_B" -ne 0 ]; then echo "---- tail of log_demo.txt"; tail -n 15 "$LOGB"; fi
  echo "---- files in \$OUT"
  ls -l "$OUT" | awk 'NR>1 {printf "%10d  %s\n", $5, $9}'
  echo "count: $(ls "$OUT" | wc -l) files; elapsed $(( $(date +%s) - T0 ))s"
} >>"$SUM"
sed -n '/^---- summary lines/,$p' "$SUM"
[ "$RC_A" -eq 0 ] && [ "$RC_B" -eq 0 ]
