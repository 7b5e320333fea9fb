#!/usr/bin/env bash
# Builds and tests the Rust, C# and Python bindings against the library in BUILD_DIR (which is
# built first when the library is missing there). Usage: scripts/test-bindings.sh [BUILD_DIR]
# The C# side uses Debian's Mono (mcs, mono), the Rust side Debian's cargo and rustc, the Python
# side Debian's python3 with a venv (pip installs the package from bindings/python, with Debian's
# setuptools and wheel: nothing comes from the network), all installed here when missing. They
# find stories260K as the C tests do ($H2O_SHARED_DIR or ../shared) and print H2O-SKIP lines for
# the tests that need it when it is absent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
[ -e "$build/libh2o-llm.so" ] || "$root/scripts/build.sh" "$build"
build="$(cd "$build" && pwd)"
"$root/scripts/install-deps.sh" mono-mcs mono-runtime cargo python3-venv python3-wheel-whl mypy
# Debian 12's Rust (cargo 1.65, rustc 1.63: the crates' rust-version), named by path so that a
# newer toolchain earlier on PATH (rustup's ~/.cargo/bin) cannot hide a need for a newer Rust.
# Its build products stay in BUILD_DIR.
cargo=/usr/bin/cargo
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc CARGO_TARGET_DIR="$build/cargo-target"
# Rust finds the library through H2O_LIB_DIR (and records it as an rpath); Mono through the
# loader path.
export H2O_LIB_DIR="$build" LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
failed=0

# Runs "$@" with its output in $log; prints the lines matching $summary, or everything on failure.
run() {
  local name="$1" summary="$2" start=$SECONDS
  shift 2
  if "$@" >"$log" 2>&1; then
    grep -E "$summary" "$log" || true
    echo "$name: passed ($((SECONDS - start)) s)"
  else
    cat "$log"
    echo "$name: FAILED ($((SECONDS - start)) s)"
    failed=1
  fi
}

# --nocapture shows the tests' H2O-SKIP notices; the tests print nothing else. The doc tests run
# with them; the documentation is then built, its warnings (broken links, bad markup) errors.
run "Rust bindings" "^test result|H2O-SKIP" \
  bash -c "cd '$root/bindings/rust' && $cargo test --offline -- --nocapture"
run "Rust bindings: cargo doc" "^error|^warning" \
  bash -c "cd '$root/bindings/rust' && RUSTDOCFLAGS='-D warnings' $cargo doc --offline --no-deps"

cs="$root/bindings/csharp"
out="$cs/out"
mkdir -p "$out"
# Each step returns on failure: set -e does not apply inside a function that run() tests.
build_cs() {
  # With its XML documentation: a public member without a doc comment is an error (CS1591).
  mcs -warnaserror -unsafe -target:library -doc:"$out/H2o.xml" -out:"$out/H2o.dll" "$cs"/src/*.cs || return 1
  # The tests are compiled with the sources: they check the internal struct declarations too.
  mcs -warnaserror -unsafe -out:"$out/H2o.Tests.exe" "$cs"/src/*.cs "$cs"/tests/*.cs || return 1
  for sample in Stream Assistant; do
    mcs -warnaserror -r:"$out/H2o.dll" -out:"$out/$sample.exe" "$cs/samples/$sample.cs" || return 1
  done
}
run "C# bindings: build (mcs)" "error" build_cs
[ $failed -eq 0 ] || exit 1
run "C# bindings" "FAILED|H2O-SKIP| passed, " mono "$out/H2o.Tests.exe"

# Python: `pip install ./bindings/python` into a fresh venv, as the README says, then the tests
# (run from their own folder, so that they import the installed package, not the checkout's).
venv="$build/python-venv"
install_python() {
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv" || return 1
  "$venv/bin/pip" install --no-index --find-links /usr/share/python-wheels wheel || return 1
  "$venv/bin/pip" install --no-build-isolation --no-index "$root/bindings/python" || return 1
}
run "Python bindings: pip install" "error" install_python
# The package's type hints hold (Debian's mypy, strict).
run "Python bindings: mypy --strict" "error" bash -c "cd '$root/bindings/python' && /usr/bin/mypy --strict --cache-dir '$build/mypy-cache' h2o_llm"
[ $failed -eq 0 ] || exit 1
shared="${H2O_SHARED_DIR:-$root/../shared}"
run "Python bindings" "H2O-SKIP|^Ran |^OK|FAILED" \
  bash -c "cd '$root/bindings/python/tests' && H2O_SHARED_DIR='$shared' '$venv/bin/python' -m unittest discover -s . -t ."
exit $failed
