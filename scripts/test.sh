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
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
