#!/usr/bin/env bash
# Configures and builds h2o. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# $H2O_BUILD_TYPE is the build type (Release); $H2O_BUILD_TARGETS the targets to build (all).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
echo "h2o: checking the build packages"
"$root/scripts/install-deps.sh"
echo "h2o: configuring $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${H2O_BUILD_TYPE:-Release}" "$@"
echo "h2o: building $build (a first build takes a few minutes)"
# shellcheck disable=SC2086  # the targets are meant to be split into arguments
cmake --build "$build" -j"$(nproc)" ${H2O_BUILD_TARGETS:+--target $H2O_BUILD_TARGETS}
