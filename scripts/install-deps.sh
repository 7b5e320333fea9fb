#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages h2o needs, when they are missing, with a line per step.
# Usage: scripts/install-deps.sh [--test] [more packages...]
#   without --test: what building and running need (scripts/run.sh, scripts/build.sh);
#   --test: also what the test suite needs to run the Vulkan backend without a GPU
#   (scripts/test.sh); the CI scripts add clang's, Mono's and cargo as more packages.
set -euo pipefail

# Building: compiler and CMake; the tokenizers (sentencepiece, PCRE2 for byte-level BPE); zstd
# (session snapshots); doctest (the test suite is configured with the library) and nlohmann-json
# (the tools' and tests' tokenizer.json reader, h2o-server's protocol); cpp-httplib (h2o-server's
# HTTP); the Vulkan backend's headers, loader and shader compiler.
build_packages=(
  build-essential
  cmake
  pkg-config
  libsentencepiece-dev
  libpcre2-dev
  libzstd-dev
  doctest-dev
  nlohmann-json3-dev
  libcpp-httplib-dev
  libvulkan-dev
  glslc
)
# Testing: Mesa's lavapipe, a Vulkan device on the CPU (it brings LLVM, ~115 MB), and the Khronos
# validation layer, so that the Vulkan backend's tests run on any machine; curl, one of the clients
# h2o-server's test drives it with; Chromium, the browser its chat page is tested in (headless).
test_packages=(
  mesa-vulkan-drivers
  vulkan-validationlayers
  curl
  chromium
)

packages=("${build_packages[@]}")
if [ "${1:-}" = "--test" ]; then
  packages+=("${test_packages[@]}")
  shift
fi
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "h2o: installing missing packages: ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null; then
  SUDO=(sudo)
else
  echo "h2o: run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
log="$(mktemp -t h2o-apt.XXXXXX)"
start=$SECONDS

# step MESSAGE COMMAND...: prints the message, runs the command with its output in $log, and
# prints the end of the log when it fails.
step() {
  echo "h2o:   $1" >&2
  shift
  if ! "$@" >>"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "h2o: failed: $* (the whole output: $log)" >&2
    exit 1
  fi
}
apt_install=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends)

step "updating the package lists" "${SUDO[@]}" apt-get update
# What installing them means, before downloading: the packages apt would install ("Inst NAME
# ..." when simulated), and the files to download ("'URI' FILE SIZE HASH" with --print-uris).
plan="$(apt-get install -s --no-install-recommends "${missing[@]}" 2>>"$log")" \
  || { tail -n 30 "$log" >&2; echo "h2o: apt-get cannot install ${missing[*]}" >&2; exit 1; }
uris="$("${apt_install[@]}" --print-uris -qq "${missing[@]}" 2>>"$log")"
count="$(grep -c '^Inst ' <<<"$plan" || true)"
mib="$(awk -v q="'" 'index($0, q) == 1 { bytes += $3 } END { printf "%.0f", bytes / 1048576 }' <<<"$uris")"
step "downloading $mib MiB" "${apt_install[@]}" --download-only "${missing[@]}"
step "unpacking and setting up $count packages" "${apt_install[@]}" "${missing[@]}"
rm -f "$log"
echo "h2o: packages installed in $((SECONDS - start)) s" >&2
