#!/usr/bin/env bash
# Installs every Debian 12 package chunkpipe needs to build, test and benchmark.
# Idempotent: skips apt entirely when everything is already present.
set -euo pipefail
packages=(
  g++ cmake make ccache pkg-config git
  nlohmann-json3-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
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
