#!/usr/bin/env bash
# Configures and builds h2o. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
echo "h2o: checking the build packages"
"$root/scripts/install-deps.sh"
echo "h2o: configuring $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${H2O_BUILD_TYPE:-Release}" "$@"
echo "h2o: building $build (a first build takes a few minutes)"
cmake --build "$build" -j"$(nproc)"
