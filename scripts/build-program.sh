#!/usr/bin/env bash
# Builds one program of h2o in build/ if needed, with one line on stderr (its output in
# build/build.log, shown when the build fails): what run.sh and serve.sh do before they start it.
# Usage: scripts/build-program.sh TARGET   (e.g. h2o-cli, h2o-server)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
target="$1"
"$root/scripts/install-deps.sh" >&2
mkdir -p "$build"
log="$build/build.log"
[ -x "$build/tools/$target" ] || echo "h2o: building $target in $build (the first build takes a few minutes)" >&2
start=$SECONDS
if ! H2O_BUILD_TARGETS="$target" "$root/scripts/build.sh" "$build" >"$log" 2>&1; then
  cat "$log" >&2
  echo "h2o: the build failed (its output above is in $log)" >&2
  exit 1
fi
echo "h2o: $target ready (build: $((SECONDS - start)) s, its output in $log)" >&2
