#!/usr/bin/env bash
# Installs a configured and built h2o into a temporary prefix, then builds tests/consumer/ there
# as a user would (CMake's find_package, pkg-config, shared and static) and runs each program
# and the installed h2o-cli with the model. Fails on the first thing that does not work.
# With --default-prefix (CI runs it so, as root), it then also installs into the build's own
# prefix (/usr/local unless configured otherwise), builds the consumer with plain pkg-config, runs
# it without LD_LIBRARY_PATH, as a user's program starts, and removes the installed files again.
# Usage: scripts/test-install.sh [--default-prefix] BUILD_DIR   (after scripts/build.sh BUILD_DIR)
# The model is $H2O_MODEL, or ../shared/models/stories260K.gguf beside the checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
default_prefix=0
if [ "${1:-}" = "--default-prefix" ]; then
  default_prefix=1
  shift
fi
[ $# -eq 1 ] || { echo "usage: $0 [--default-prefix] BUILD_DIR" >&2; exit 2; }
build="$1"
model="${H2O_MODEL:-$root/../shared/models/stories260K.gguf}"
[ -f "$model" ] || { echo "h2o: no model at $model (set H2O_MODEL)" >&2; exit 1; }
start=$SECONDS
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

echo "== install and consumer test ($build -> temporary prefix)"
# The build's install_manifest.txt lists what a user installed from it (scripts/uninstall.sh
# reads it): the temporary install must not replace it.
manifest="$build/install_manifest.txt"
[ ! -f "$manifest" ] || cp "$manifest" "$tmp/user_manifest.txt"
cmake --install "$build" --prefix "$prefix" >/dev/null
if [ -f "$tmp/user_manifest.txt" ]; then cp "$tmp/user_manifest.txt" "$manifest"; else rm -f "$manifest"; fi
pcdir="$(dirname "$(find "$prefix" -name h2o-llm.pc)")"
libdir="$(dirname "$pcdir")"
for f in "$prefix/include/h2o/h2o.h" "$libdir/libh2o-llm.so" "$libdir/libh2o-llm-static.a" \
         "$libdir/cmake/h2o-llm/h2o-llm-config.cmake" "$pcdir/h2o-llm-static.pc"; do
  [ -e "$f" ] || { echo "h2o: not installed: $f" >&2; exit 1; }
done
# The SONAME link chain: libh2o-llm.so -> libh2o-llm.so.MAJOR -> libh2o-llm.so.MAJOR.MINOR.PATCH.
soname="$(readelf -d "$libdir/libh2o-llm.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')"
[ -L "$libdir/libh2o-llm.so" ] && [ -L "$libdir/$soname" ] && [ -f "$(readlink -f "$libdir/$soname")" ] \
  || { echo "h2o: broken SONAME links for $soname in $libdir" >&2; exit 1; }

# Each program prints the prompt's continuation; all must print the same greedy text.
expected=""
check() {  # check NAME COMMAND...: runs it, requires success and the same text as the others
  local name="$1" out
  shift
  out="$("$@" 2>"$tmp/stderr")" || { echo "h2o: $name failed:" >&2; cat "$tmp/stderr" >&2; exit 1; }
  [ -n "$expected" ] || expected="$out"
  [ "$out" = "$expected" ] || { printf 'h2o: %s printed\n%s\ninstead of\n%s\n' "$name" "$out" "$expected" >&2; exit 1; }
  echo "  ok  $name"
}
not_linked_to_shared() {  # a statically linked program must not need libh2o-llm.so
  ! readelf -d "$1" | grep -q 'NEEDED.*libh2o-llm' || { echo "h2o: $1 needs libh2o-llm.so" >&2; exit 1; }
}

cmake -S "$root/tests/consumer" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cmake" >/dev/null
not_linked_to_shared "$tmp/cmake/consumer-static"
check "find_package, h2o::h2o-llm" "$tmp/cmake/consumer-shared" "$model"
check "find_package, h2o::h2o-llm-static" "$tmp/cmake/consumer-static" "$model"

# The temporary prefix is not one the loader searches: its programs legitimately need
# PKG_CONFIG_PATH and LD_LIBRARY_PATH (the default prefix is tested without them below).
export PKG_CONFIG_PATH="$pcdir"
# shellcheck disable=SC2046  # pkg-config's output is meant to be split into arguments
cc -o "$tmp/pc-shared" "$root/tests/consumer/consumer.c" $(pkg-config --cflags --libs h2o-llm)
# shellcheck disable=SC2046
cc -o "$tmp/pc-static" "$root/tests/consumer/consumer.c" $(pkg-config --static --cflags --libs h2o-llm-static)
not_linked_to_shared "$tmp/pc-static"
LD_LIBRARY_PATH="$libdir" check "pkg-config h2o-llm" "$tmp/pc-shared" "$model"
check "pkg-config --static h2o-llm-static" "$tmp/pc-static" "$model"

# The installed programs find the installed library through their RPATH.
for tool in h2o-cli h2o-bench h2o-eval h2o-quantize h2o-synth; do
  [ -x "$prefix/bin/$tool" ] || { echo "h2o: not installed: bin/$tool" >&2; exit 1; }
done
text="$("$prefix/bin/h2o-cli" -m "$model" -p "Once upon a time" -n 8 --temp 0 2>"$tmp/stderr")" \
  || { echo "h2o: installed h2o-cli failed:" >&2; cat "$tmp/stderr" >&2; exit 1; }
[ -n "$text" ] || { echo "h2o: installed h2o-cli printed nothing" >&2; exit 1; }
echo "  ok  installed h2o-cli"
unset PKG_CONFIG_PATH

# The default prefix: what `cmake --install BUILD_DIR` gives a user who then builds with
# pkg-config and starts the program with nothing set (this needs the loader's cache refreshed).
if [ $default_prefix -eq 1 ]; then
  system_prefix="$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")"
  echo "== install into $system_prefix and start a program built with pkg-config"
  [ "$(id -u)" -eq 0 ] || { echo "h2o: --default-prefix installs into $system_prefix: run as root" >&2; exit 1; }
  [ ! -e "$system_prefix/include/h2o/h2o.h" ] \
    || { echo "h2o: $system_prefix already holds an h2o install, which this test would remove" >&2; exit 1; }
  # Removes the install whether the checks below pass or not, and gives the build back the
  # manifest of what a user installed from it.
  remove_default_install() {
    [ ! -f "$manifest" ] || "$root/scripts/uninstall.sh" "$build" >/dev/null || true
    [ ! -f "$tmp/user_manifest.txt" ] || cp "$tmp/user_manifest.txt" "$manifest"
    rm -rf "$tmp"
  }
  trap remove_default_install EXIT
  cmake --install "$build" >"$tmp/install.log" || {
    cat "$tmp/install.log" >&2
    echo "h2o: cmake --install $build failed" >&2
    exit 1
  }
  # shellcheck disable=SC2046
  cc -o "$tmp/app" "$root/tests/consumer/consumer.c" $(pkg-config --cflags --libs h2o-llm)
  check "pkg-config h2o-llm, run without LD_LIBRARY_PATH" env -u LD_LIBRARY_PATH "$tmp/app" "$model"
fi

echo "== install and consumer test passed in $((SECONDS - start)) s"
