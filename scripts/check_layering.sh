#!/usr/bin/env bash
# Fails when a file includes a header of a module its own module may not depend on
# (docs/ARCHITECTURE.md, "Layering"). Usage: scripts/check_layering.sh [SRC_DIR] (default src).
# Each module lists the modules it may include; a few seams are narrower than a whole module:
# only the executor files of engine/ include worker/, server/ sees engine/ only through
# engine_client.h and metrics.h, and proxy/ uses only server/http_server.h and api/json_fields.h.
set -uo pipefail
src="${1:-$(dirname "$0")/../src}"
declare -A allowed=(
  [common]=""
  [tensor]="common"
  [kernels]="common tensor"
  [model]="common tensor kernels dist"
  [tokenizer]="common"
  [kv]="common"
  [sched]="common kv"
  [dist]="common"
  [worker]="common tensor kernels model sched dist"
  [transfer]="common dist kv sched worker model"
  [engine]="common sched kv tokenizer dist worker"
  [api]="common sched tokenizer"
  [server]="common api tokenizer engine"
  [httpclient]="common"
  [proxy]="common api server httpclient"
  [bench]="common tokenizer httpclient"
  [cli]="*"
)
violations=0
report() {
  echo "layering: $1"
  violations=$((violations + 1))
}
while IFS= read -r -d '' file; do
  rel="${file#"$src"/}"
  module="${rel%%/*}"
  [ "$module" = "$rel" ] && continue
  if [ -z "${allowed[$module]+set}" ]; then
    report "$rel: module '$module' has no entry in scripts/check_layering.sh"
    continue
  fi
  ok=" ${allowed[$module]} "
  while IFS= read -r header; do
    dep="${header%%/*}"
    [ "$dep" = "$module" ] && continue
    [ -z "${allowed[$dep]+set}" ] && continue  # not one of ours (e.g. nlohmann/json.hpp)
    if [ "$ok" != " * " ] && [[ "$ok" != *" $dep "* ]]; then
      report "$rel includes $header: $module may include only {${allowed[$module]}}"
      continue
    fi
    name="$(basename "$rel")"
    if [ "$module" = engine ] && [ "$dep" = worker ] && [[ "$name" != *_executor.* ]]; then
      report "$rel includes $header: in engine/ only the executors may include worker/"
    fi
    if [ "$module" = proxy ] && [ "$dep" = server ] && [ "$header" != server/http_server.h ]; then
      report "$rel includes $header: proxy/ uses only server/'s HTTP transport"
    fi
    if [ "$module" = proxy ] && [ "$dep" = api ] && [ "$header" != api/json_fields.h ]; then
      report "$rel includes $header: proxy/ uses only api/'s field conversions"
    fi
    if [ "$module" = server ] && [ "$dep" = engine ] &&
      [ "$header" != engine/engine_client.h ] && [ "$header" != engine/metrics.h ]; then
      report "$rel includes $header: server/ sees the engine only through engine/engine_client.h"
    fi
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$file")
done < <(find "$src" -type f \( -name '*.h' -o -name '*.cpp' \) -print0 | sort -z)
if [ "$violations" -gt 0 ]; then
  echo "layering: $violations wrong-way include(s) under $src"
  exit 1
fi
echo "layering: every include under $src points the allowed way"
