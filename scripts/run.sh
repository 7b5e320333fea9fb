#!/usr/bin/env bash
# Builds h2o-cli if needed and generates text with the default model.
# Usage: scripts/run.sh [PROMPT] [h2o-cli options...]
# The model is $H2O_MODEL, or ../shared/models/stories260K.gguf beside the checkout.
# Progress goes to stderr, one line for the build (its output is in build/build.log, shown when
# it fails), so that stdout carries only the generated text.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
model="${H2O_MODEL:-$root/../shared/models/stories260K.gguf}"
if [ ! -f "$model" ]; then
  echo "h2o: no model at $model. Set H2O_MODEL to a GGUF Llama model, or place the project's" >&2
  echo "     shared data folder beside the checkout (../shared/models/stories260K.gguf)." >&2
  exit 1
fi
"$root/scripts/install-deps.sh" >&2
mkdir -p "$build"
log="$build/build.log"
[ -x "$build/tools/h2o-cli" ] || echo "h2o: building h2o-cli in $build (the first build takes a few minutes)" >&2
start=$SECONDS
if ! H2O_BUILD_TARGETS=h2o-cli "$root/scripts/build.sh" "$build" >"$log" 2>&1; then
  cat "$log" >&2
  echo "h2o: the build failed (its output above is in $log)" >&2
  exit 1
fi
echo "h2o: h2o-cli ready (build: $((SECONDS - start)) s, its output in $log)" >&2
prompt="${1:-Once upon a time}"
shift || true
exec "$build/tools/h2o-cli" -m "$model" -p "$prompt" -n 128 "$@"
