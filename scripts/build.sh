#!/usr/bin/env bash
# Configures and builds chunkpipe (Release) into ./build. Extra args go to cmake --build.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1  # cache hits from any checkout path
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" >/dev/null
cmake --build build -j "$jobs" "$@"
