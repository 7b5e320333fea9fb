#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages h2o needs to build and test, when they are missing.
# Usage: scripts/install-deps.sh [more packages...] (the CI scripts add clang's and Mono's).
set -euo pipefail

# Build: compiler, CMake, sentencepiece, zstd (session snapshots), doctest; the Vulkan backend:
# headers, loader and glslc; running and validating it without a GPU: Mesa's lavapipe and the Khronos validation layer.
packages=(build-essential cmake pkg-config libsentencepiece-dev libzstd-dev doctest-dev
          libvulkan-dev glslc mesa-vulkan-drivers vulkan-validationlayers "$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "h2o: installing missing packages: ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
  SUDO=
elif command -v sudo >/dev/null; then
  SUDO=sudo
else
  echo "h2o: run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
