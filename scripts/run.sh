#!/usr/bin/env bash
# Builds h2o-cli if needed and generates text with the default model.
# Usage: scripts/run.sh [PROMPT] [h2o-cli options...]
# The model is $H2O_MODEL, or ../shared/models/stories260K.gguf beside the checkout.
# Progress goes to stderr, one line for the build (its output is in build/build.log, shown when
# it fails), so that stdout carries only the generated text.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${H2O_MODEL:-$root/../shared/models/stories260K.gguf}"
if [ ! -f "$model" ]; then
  echo "h2o: no model at $model. Set H2O_MODEL to a GGUF Llama model, or place the project's" >&2
  echo "     shared data folder beside the checkout (../shared/models/stories260K.gguf)." >&2
  exit 1
fi
"$root/scripts/build-program.sh" h2o-cli
prompt="${1:-Once upon a time}"
shift || true
exec "$root/build/tools/h2o-cli" -m "$model" -p "$prompt" -n 128 "$@"
