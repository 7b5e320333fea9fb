#!/usr/bin/env bash
# Builds h2o-server if needed and serves the default model in the OpenAI chat-completions protocol
# on http://127.0.0.1:8080 (this machine only).
# Usage: scripts/serve.sh [h2o-server options...]   (h2o-server --help lists them)
# The model is $H2O_MODEL, or ../shared/models/stories260K.gguf beside the checkout. That one has
# no chat template, so the script names one for it (zephyr's markers, plain text to its
# vocabulary); a model with a template needs none. One line for the build on stderr, as run.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${H2O_MODEL:-$root/../shared/models/stories260K.gguf}"
if [ ! -f "$model" ]; then
  echo "h2o: no model at $model. Set H2O_MODEL to a GGUF model, or place the project's" >&2
  echo "     shared data folder beside the checkout (../shared/models/stories260K.gguf)." >&2
  exit 1
fi
format=()
[ -n "${H2O_MODEL:-}" ] || format=(--chat-format zephyr)
"$root/scripts/build-program.sh" h2o-server
exec "$root/build/tools/h2o-server" -m "$model" "${format[@]}" "$@"
