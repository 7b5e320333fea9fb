#!/usr/bin/env bash
# Removes what `cmake --install BUILD_DIR` installed: the files BUILD_DIR/install_manifest.txt
# lists, the folders that leaves empty below the prefix's own (bin, include, lib, ...), and, as
# root, the loader's cache entries (ldconfig). Then the manifest itself.
# Usage: scripts/uninstall.sh BUILD_DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build="$1"
manifest="$build/install_manifest.txt"
[ -f "$manifest" ] || { echo "h2o: $manifest not found: nothing was installed from $build" >&2; exit 1; }
# The build's configured prefix: folders are removed only below it (after `cmake --install
# --prefix DIR` elsewhere, only the files go).
prefix="$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")"

xargs -r -d '\n' rm -f <"$manifest"
while read -r dir; do
  # Up to, not including, the prefix's top-level folders; not at all outside the prefix.
  while [[ "$dir" == "$prefix"/*/* ]]; do
    rmdir "$dir" 2>/dev/null || break
    dir="$(dirname "$dir")"
  done
done < <(xargs -r -d '\n' -n 1 dirname <"$manifest" | sort -u)
[ "$(id -u)" -ne 0 ] || ldconfig
echo "h2o: removed the $(wc -l <"$manifest") files installed from $build"
rm -f "$manifest"
