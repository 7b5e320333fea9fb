#!/usr/bin/env bash
# Builds h2o and runs the whole test suite.
# Usage: scripts/test.sh [BUILD_DIR] [extra cmake args...]
# Tests find the shared data through $H2O_SHARED_DIR or ../shared beside the checkout, and report
# themselves skipped when it is absent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
"$root/scripts/install-deps.sh" --test
"$root/scripts/build.sh" "$build" "$@"
# The official OpenAI client for Node, which h2o-server's end-to-end test drives the server with
# (Node.js and npm as the machine has them; without them that part of the test says it is skipped).
# Version 6: version 7 needs Node.js 22.
if command -v npm >/dev/null && [ ! -d "$build/npm/node_modules/openai" ]; then
  echo "h2o: installing the openai npm package into $build/npm" >&2
  npm install --silent --no-audit --no-fund --prefix "$build/npm" openai@6.49.0 >/dev/null \
    || echo "h2o: the openai npm package could not be installed: the server test will say that part is skipped" >&2
fi
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
