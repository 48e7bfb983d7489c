#!/usr/bin/env bash
# Unpacks what tools/device_build_assets.sh left in $OUT (after it came back to this machine) into the repo.
# Usage: bash tools/unpack_device_outputs.sh <folder with golden.tar.gz.part-NN / demo.tar.gz.part-NN / summary.txt>
#        [golden|demo ...]   (default: both)
# Checks each reassembled archive against the sha256 in summary.txt and refuses members outside
# tests/golden/ and assets/demo/. Existing files there are overwritten.
set -euo pipefail
SRC=${1:?usage: $0 <folder with the pieces> [golden|demo ...]}
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(golden demo)
SRC=$(cd "$SRC" && pwd)
cd "$(dirname "$0")/.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
rc=0
for name in "${NAMES[@]}"; do
  case $name in golden) allow='tests/golden' ;; demo) allow='assets/demo' ;; *) echo "unknown part $name"; exit 2 ;; esac
  shopt -s nullglob
  parts=("$SRC/$name.tar.gz.part-"*)
  shopt -u nullglob
  if [ ${#parts[@]} -eq 0 ]; then echo "$name: no pieces in $SRC"; rc=1; continue; fi
  cat "${parts[@]}" >"$TMP/$name.tar.gz"   # the glob sorts part-00, part-01, ...
  got=$(sha256sum "$TMP/$name.tar.gz" | cut -d' ' -f1)
  want=$(awk -v n="$name.tar.gz" '$1 == "sha256" && $2 == n {print $3}' "$SRC/summary.txt" 2>/dev/null || true)
  if [ -z "$want" ]; then echo "$name: no sha256 in summary.txt (not checked)";
  elif [ "$got" != "$want" ]; then echo "$name: sha256 mismatch ($got != $want)"; rc=1; continue; fi
  bad=$(tar -tzf "$TMP/$name.tar.gz" | grep -v -E "^$allow(/|\$)" || true)
  if [ -n "$bad" ]; then echo "$name: refusing members outside $allow:"; echo "$bad" | head; rc=1; continue; fi
  tar -xzf "$TMP/$name.tar.gz"
  echo "$name: ${#parts[@]} piece(s), $(tar -tzf "$TMP/$name.tar.gz" | grep -v '/$' | wc -l) files -> $allow ($(du -sh "$allow" | cut -f1))"
done
exit $rc
