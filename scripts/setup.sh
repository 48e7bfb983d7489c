#!/usr/bin/env bash
# Installs everything the build and the tests need, from Debian packages and the npm registry.
# Usage: scripts/setup.sh            (run as root, or with sudo available)
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  cmake g++ make pkg-config
  nlohmann-json3-dev   # JSON (config.json, tokenizer.json, safetensors headers, JSONL)
  libpcre2-dev         # pre-tokenizer split regex (UTF + JIT)
  libcli11-dev         # command line (and `dflash train --config` TOML/INI files)
  libopenblas-dev      # CPU GEMMs
  libgtest-dev libgmock-dev  # tests
  zlib1g-dev           # reading .jsonl.gz
  libssl-dev           # SHA-256 of tokenizer / data files (libcrypto)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi

# npm oracles for tokenizer and chat-template parity tests (pinned in tests/oracle/package.json).
if [ ! -d tests/oracle/node_modules ]; then
  (cd tests/oracle && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "setup: ok"
