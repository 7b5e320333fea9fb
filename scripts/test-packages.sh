#!/usr/bin/env bash
# Makes the Debian packages of a configured and built h2o (cpack -G DEB: cmake/package.cmake),
# checks what each holds and depends on, installs them with dpkg, builds tests/consumer against
# them as a user would (CMake's find_package and pkg-config, shared and static), runs each program
# and the installed h2o-cli with the model, then removes the packages and checks that nothing of
# them is left. Run as root on a machine without h2o installed (in /usr/local or as packages).
# Usage: scripts/test-packages.sh BUILD_DIR   (after scripts/build.sh BUILD_DIR)
# The model is $H2O_MODEL, or ../shared/models/stories260K.gguf beside the checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build="$(cd "$1" && pwd)"
model="${H2O_MODEL:-$root/../shared/models/stories260K.gguf}"
[ -f "$model" ] || { echo "h2o: no model at $model (set H2O_MODEL)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "h2o: run as root: the packages are installed with dpkg" >&2; exit 1; }
[ ! -e /usr/local/include/h2o/h2o.h ] || { echo "h2o: /usr/local holds an h2o install, which would hide the packages' files" >&2; exit 1; }
start=$SECONDS
# cpack finds the programs and libraries to give dpkg-shlibdeps with `file`.
"$root/scripts/install-deps.sh" file
abi="$(sed -n 's/^#define H2O_ABI_VERSION \([0-9]*\).*/\1/p' "$root/include/h2o/h2o.h")"
version="$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")"
runtime="libh2o-llm$abi" packages=("libh2o-llm$abi" libh2o-llm-dev h2o-tools)
for p in "${packages[@]}"; do
  ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q " installed$" \
    || { echo "h2o: package $p is installed already; this test would remove it" >&2; exit 1; }
done

echo "== Debian packages of $build (cpack -G DEB)"
rm -rf "$build/packages"
(cd "$build" && cpack -G DEB >"$build/packages.log" 2>&1) || { cat "$build/packages.log" >&2; echo "h2o: cpack failed" >&2; exit 1; }
tmp="$(mktemp -d)"
installed=0
cleanup() {
  [ $installed -eq 0 ] || dpkg --purge "${packages[@]}" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
deb() { echo "$build/packages/${1}_${version}_$(dpkg --print-architecture).deb"; }
fail() { echo "h2o: $*" >&2; exit 1; }
# Each package: its files, and dependencies that name what it needs.
holds() {  # holds PACKAGE PATH...: the package contains each path (under /usr)
  local package="$1" list
  list="$(dpkg-deb -c "$(deb "$package")" | awk '{print $6}')"
  for f in "${@:2}"; do grep -qx "\./usr/$f" <<<"$list" || fail "$package lacks /usr/$f"; done
}
depends_on() {  # depends_on PACKAGE NAME...: its Depends field names each
  local field
  field="$(dpkg-deb -f "$(deb "$1")" Depends)"
  for d in "${@:2}"; do grep -q "\(^\|, \)$d\( \|,\|$\)" <<<"$field" || fail "$1 does not depend on $d (Depends: $field)"; done
}
holds "$runtime" "lib/libh2o-llm.so.$abi" "lib/libh2o-llm.so.$version" share/doc/h2o/LICENSE
holds libh2o-llm-dev include/h2o/h2o.h include/h2o/h2o_experimental.h lib/libh2o-llm.so lib/libh2o-llm-static.a \
  lib/pkgconfig/h2o-llm.pc lib/pkgconfig/h2o-llm-static.pc lib/cmake/h2o-llm/h2o-llm-config.cmake
holds h2o-tools bin/h2o-cli bin/h2o-chat bin/h2o-info bin/h2o-bench bin/h2o-eval bin/h2o-quantize bin/h2o-synth bin/h2o-server
depends_on "$runtime" libsentencepiece0 libzstd1 libpcre2-8-0 libstdc++6
depends_on libh2o-llm-dev "$runtime" libsentencepiece-dev libzstd-dev
depends_on h2o-tools "$runtime" libcpp-httplib0.11
[ "$(dpkg-deb -f "$(deb libh2o-llm-dev)" Depends | grep -o "$runtime ([^)]*)")" = "$runtime (= $version)" ] \
  || fail "libh2o-llm-dev must depend on exactly $runtime $version"
echo "  ok  contents and dependencies"

echo "== dpkg -i, then programs built against the packages"
installed=1
dpkg -i "$(deb "$runtime")" "$(deb libh2o-llm-dev)" "$(deb h2o-tools)" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "dpkg -i failed"; }
expected=""
check() {  # check NAME COMMAND...: runs it, requires success and the same text as the others
  local name="$1" out
  shift
  out="$("$@" 2>"$tmp/stderr")" || { cat "$tmp/stderr" >&2; fail "$name failed"; }
  [ -n "$expected" ] || expected="$out"
  [ "$out" = "$expected" ] || fail "$name printed '$out' instead of '$expected'"
  echo "  ok  $name"
}
# Nothing set: the packages' files are where the compiler, CMake, pkg-config and the loader look.
cmake -S "$root/tests/consumer" -B "$tmp/cmake" >/dev/null
cmake --build "$tmp/cmake" >/dev/null
check "find_package, h2o::h2o-llm" env -u LD_LIBRARY_PATH "$tmp/cmake/consumer-shared" "$model"
check "find_package, h2o::h2o-llm-static" "$tmp/cmake/consumer-static" "$model"
# shellcheck disable=SC2046  # pkg-config's output is meant to be split into arguments
cc -o "$tmp/pc-shared" "$root/tests/consumer/consumer.c" $(pkg-config --cflags --libs h2o-llm)
# shellcheck disable=SC2046
cc -o "$tmp/pc-static" "$root/tests/consumer/consumer.c" $(pkg-config --static --cflags --libs h2o-llm-static)
check "pkg-config h2o-llm" env -u LD_LIBRARY_PATH "$tmp/pc-shared" "$model"
check "pkg-config --static h2o-llm-static" "$tmp/pc-static" "$model"
[ -n "$(/usr/bin/h2o-cli -m "$model" -p "Once upon a time" -n 8 --temp 0 2>"$tmp/stderr")" ] || { cat "$tmp/stderr" >&2; fail "the installed h2o-cli failed"; }
echo "  ok  /usr/bin/h2o-cli"
[ "$(/usr/bin/h2o-server --version)" = "h2o-server $version" ] || fail "the installed h2o-server does not start"
echo "  ok  /usr/bin/h2o-server"

echo "== dpkg --purge"
dpkg --purge "${packages[@]}" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "dpkg --purge failed"; }
installed=0
for f in /usr/lib/libh2o-llm.so."$abi" /usr/include/h2o/h2o.h /usr/bin/h2o-cli /usr/lib/pkgconfig/h2o-llm.pc; do
  [ ! -e "$f" ] || fail "$f is left after dpkg --purge"
done
! ldconfig -p | grep -q "libh2o-llm.so.$abi" || fail "the loader's cache still lists libh2o-llm.so.$abi"
echo "== Debian packages passed in $((SECONDS - start)) s"
