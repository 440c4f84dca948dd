#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format (the root .clang-format) makes of
# it, naming each file. Usage: scripts/check_format.sh [REPO_DIR] (default: this checkout).
set -uo pipefail
cd "${1:-$(dirname "$0")/..}" || exit 2
mapfile -t files < <(git ls-files '*.cpp' '*.h' | grep -v '^tests/data/')
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then
    echo "format: $f differs from clang-format's output (run: clang-format -i $f)"
    bad=$((bad + 1))
  fi
done
if [ "$bad" -gt 0 ]; then
  echo "format: $bad of ${#files[@]} files need clang-format"
  exit 1
fi
echo "format: all ${#files[@]} files match clang-format"
