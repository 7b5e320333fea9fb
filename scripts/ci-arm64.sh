#!/usr/bin/env bash
# Cross-builds h2o for ARM64 (aarch64-linux-gnu) and runs its tests under qemu-aarch64: once on an
# emulated CPU with every feature (QEMU_CPU=max: the i8mm kernels, and every lower level forced),
# then on a Neoverse N1 (dotprod, no i8mm) and a Cortex-A57 (ARMv8.0: the baseline NEON kernels).
# Usage: scripts/ci-arm64.sh [BUILD_DIR]   (default: build-arm64)
#
# The ARM64 libraries (sentencepiece, zstd, PCRE2) and the doctest and nlohmann-json headers are
# unpacked from Debian's packages into BUILD_DIR/sysroot, not installed: Debian 12's sentencepiece
# packages are not multi-arch, and installing the arm64 ones would remove the native ones.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-arm64}"
sysroot="$build/sysroot"
start=$SECONDS

# ---- tools: the cross compiler and the user-mode emulator -------------------------------------
missing=()
for p in g++-aarch64-linux-gnu qemu-user; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] && SUDO= || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- the ARM64 sysroot, prepared once (again when the package list changes) --------------------
arm64_debs="libsentencepiece0:arm64 libsentencepiece-dev:arm64 libzstd1:arm64 libzstd-dev:arm64 libpcre2-8-0:arm64
            libpcre2-dev:arm64 doctest-dev nlohmann-json3-dev"
if [ "$(cat "$sysroot/.complete" 2>/dev/null)" != "$arm64_debs" ]; then
  [ "$(id -u)" -eq 0 ] && SUDO= || SUDO=sudo
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq
  rm -rf "$sysroot" "$build/debs"
  mkdir -p "$build/debs" "$sysroot"
  # shellcheck disable=SC2086  # the list is meant to be split into package names
  (cd "$build/debs" && apt-get download -qq $arm64_debs)
  for deb in "$build"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
  printf '%s' "$arm64_debs" >"$sysroot/.complete"
fi

# ---- cross build --------------------------------------------------------------------------------
cmake -S "$root" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" \
      -DH2O_ARM64_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE=Release -DH2O_WERROR=ON >/dev/null
# What the tests below run, and the library the NuGet package takes.
cmake --build "$build" -j"$(nproc)" --target h2o-tests h2o-cli h2o-llm

# ---- tests under emulation ----------------------------------------------------------------------
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
export LD_LIBRARY_PATH="$sysroot/usr/lib/aarch64-linux-gnu"
tests="$build/tests/h2o-tests"
model="$root/../shared/models/stories260K.gguf"
[ -n "${H2O_SHARED_DIR:-}" ] && model="$H2O_SHARED_DIR/models/stories260K.gguf"

# On the emulated CPU with every feature: the whole suite except the Vulkan tests (that backend is
# not built) and the tests that stream tens of thousands of tokens, generate models or sample
# thousands of tokens with grammars, which take minutes under emulation (the tool-call sampling
# test took 982 s, more than all the others together) and exercise nothing architecture-specific
# that the rest does not.
# On CPUs without i8mm, and without dotprod: the kernel tests and the golden-parity tests.
slow='*tens of thousands*,*long document*,*position rolling runs far*,*session memory is fixed*,*runs far past its context*'
slow="$slow,*a synthetic model to every preset*,*tok512.model tokenizes exactly*,*shared by many threads*"
slow="$slow,*required calls sampled from a model*"
# This one starts a second ARM64 program itself, which the host cannot run outside the emulator.
slow="$slow,*a fresh process continues*"
kernels='*kernel selection*,*activation quantization*,*matmul*,*dequantize*,*vector operations*'
golden='*greedy*,*batched prompt processing*,*same seed*'

# Runs the tests on one emulated CPU, its output into $build/qemu-$cpu$part.log: QEMU_CPU model,
# the kernel level it must choose, a tag for the part of the cases run ("" or "-partN"), doctest
# filter options...
# (Called where a failure does not stop the script, so each step returns its failure itself.)
run_tests() {
  local cpu=$1 level=$2 part=$3 t0=$SECONDS log="$build/qemu-$1$3.log"
  shift 3
  {
    echo "== QEMU_CPU=$cpu: kernels $level${part:+ (${part#-})}"
    QEMU_CPU=$cpu qemu-aarch64 "$build/tools/h2o-cli" -m "$model" -p "Once" -n 4 --temp 0 --json --backend cpu |
      grep -F "\"backend\":\"cpu ($level kernels" || { echo "QEMU_CPU=$cpu did not choose the $level kernels"; return 1; }
    mkdir -p "$build/tmp-$cpu$part"
    H2O_TEST_TMPDIR="$build/tmp-$cpu$part" QEMU_CPU=$cpu qemu-aarch64 "$tests" --no-intro "$@" | grep -v '^H2O-SKIP' || return 1
    echo "   ($((SECONDS - t0)) s)"
  } >"$log" 2>&1
}
# The emulator runs one thread of work: on two cores, the long run on the newest CPU goes in two
# halves side by side (doctest's --first and --last count the cases passing the filters from 1,
# in an order shuffled alike in both, so that the slow cases, which sit together in the files,
# split between the halves), then the two short runs side by side. The Vulkan backend is not
# built here: a golden test that also checks Vulkan is left out by name.
all="--test-case-exclude=$slow,*vulkan*,*Vulkan*"
shuffled="--order-by=rand --rand-seed=1"
count=$(QEMU_CPU=max qemu-aarch64 "$tests" --count "$all" | sed -n 's/.*passing the current filters: \([0-9]*\).*/\1/p')
[ -n "$count" ] || { echo "h2o: could not count the ARM64 test cases" >&2; exit 1; }
half=$((count / 2))
rm -f "$build"/qemu-*.log
status=0
# shellcheck disable=SC2086  # $shuffled is two options
run_tests max neon+i8mm -part1 "$all" $shuffled --first=1 --last=$half &
first=$!
# shellcheck disable=SC2086
run_tests max neon+i8mm -part2 "$all" $shuffled --first=$((half + 1)) --last="$count" || status=1
wait "$first" || status=1
short="--test-case-exclude=*vulkan*,*Vulkan*"
run_tests neoverse-n1 neon+dotprod "" --test-case="$kernels,$golden" "$short" &
first=$!
run_tests cortex-a57 neon "" --test-case="$kernels,$golden" "$short" || status=1
wait "$first" || status=1
cat "$build"/qemu-*.log
[ $status -eq 0 ] || { echo "h2o: the ARM64 tests failed (above)" >&2; exit 1; }

echo "== a kernel level the CPU lacks is refused"
if out=$(QEMU_CPU=cortex-a57 H2O_CPU_KERNELS=neon+dotprod qemu-aarch64 "$build/tools/h2o-cli" -m "$model" \
           -p "Once" -n 1 2>&1); then
  echo "H2O_CPU_KERNELS=neon+dotprod ran on a CPU without dotprod" >&2
  exit 1
fi
grep -F "H2O_CPU_KERNELS=neon+dotprod: this CPU cannot run" <<<"$out"

echo "== ARM64 CI finished in $((SECONDS - start)) s"
