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
# The official OpenAI client for Node, which h2o-server's end-to-end test drives the server with;
# Ajv, the JSON-schema validator that checks constrained replies; puppeteer-core, which drives
# Chromium through the chat page (Node.js and npm as the machine has them; without them those
# tests say what they skipped). openai 6: 7 needs Node.js 22.
npm_packages=(openai@6.49.0 ajv@8.17.1 ajv-formats@3.0.1 puppeteer-core@24.43.1)
if command -v npm >/dev/null && { [ ! -d "$build/npm/node_modules/openai" ] || [ ! -d "$build/npm/node_modules/ajv-formats" ] ||
                                  [ ! -d "$build/npm/node_modules/puppeteer-core" ]; }; then
  echo "h2o: installing the npm packages ${npm_packages[*]} into $build/npm" >&2
  npm install --silent --no-audit --no-fund --prefix "$build/npm" "${npm_packages[@]}" >/dev/null \
    || echo "h2o: the npm packages could not be installed: the tests that use them will say they are skipped" >&2
fi
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
