#!/usr/bin/env bash
# The CI stages beyond README.md's (.ci/run runs those, then calls this script):
#   1. one clang build, warnings as errors, with ASan + UBSan and libFuzzer's instrumentation
#      (H2O_SANITIZE=ON H2O_FUZZ=ON): the library, the tools, the test suite (less the Vulkan
#      parity sweeps and the golden sweeps, which the gcc stage ran, and the synthesis of a model
#      of every architecture, 112 s sanitized; the Vulkan host code runs on lavapipe) with the
#      replay of the generated seed corpus and the saved crash inputs (tests/fuzz/crashes), then
#      $H2O_FUZZ_SECONDS (default 30) of fuzzing per target;
#   2. ThreadSanitizer (gcc): the library and the multi-threaded tests (h2o-thread-tests).
# Each stage prints the seconds it took. Usage: scripts/ci-matrix.sh [BUILD_PREFIX]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${1:-$root/build-ci}"
fuzz_seconds="${H2O_FUZZ_SECONDS:-30}"
jobs="$(nproc)"
start=$SECONDS

# clang, then the sanitizer runtimes of that clang's version (libFuzzer is among them).
"$root/scripts/install-deps.sh" clang
"$root/scripts/install-deps.sh" "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"

stage() {
  echo "== $1 took $((SECONDS - stage_start)) s"
  stage_start=$SECONDS
}
stage_start=$SECONDS

echo "== clang (warnings are errors) with ASan + UBSan and libFuzzer's instrumentation: build, test suite, corpus replay"
fuzz="$prefix-fuzz"
# CUDA stays off: nvcc compiles with its own host compiler (gcc), whatever CXX is, so the CUDA
# code was compiled exactly so in README.md's stage.
CC=clang CXX=clang++ cmake -S "$root" -B "$fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DH2O_SANITIZE=ON -DH2O_FUZZ=ON \
  -DH2O_WERROR=ON -DH2O_CUDA=OFF >/dev/null
cmake --build "$fuzz" -j"$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Lavapipe keeps allocations of LLVM's one-time setup in its statics; when the Vulkan loader
# unloads it (vkDestroyInstance) they become unreachable, and LeakSanitizer reports them (128 bytes
# per instance with Debian 12's mesa 22.3.6-1+deb12u2). Preloaded, the driver stays resident and
# only leaks of ours are reported. (A preloaded library comes before the ASan runtime, which ASan
# accepts with verify_asan_link_order=0.)
lavapipe=$(sed -n 's/.*"library_path": *"\(.*\)".*/\1/p' /usr/share/vulkan/icd.d/lvp_icd.*.json 2>/dev/null | head -n 1)
ASAN_OPTIONS=$ASAN_OPTIONS:verify_asan_link_order=0 LD_PRELOAD="${lavapipe:-}" \
  ctest --test-dir "$fuzz" --output-on-failure -j"$jobs" \
    -E '^(device parity|architecture goldens)( with real vocabularies)?:|^synth_tool_writes_every_architecture$'
stage "the sanitized clang build and its test suite"
# Each target fuzzes on its own core for $fuzz_seconds; with two cores, two at a time.
fuzz_one() {
  # New inputs go to a scratch corpus; the generated seeds are read only. A crash fails CI and
  # leaves the input in $fuzz/artifacts/ to be minimised and added to
  # tests/fuzz/crashes/$target/ with the fix.
  local target="$1" log="$fuzz/artifacts/$1.log"
  mkdir -p "$fuzz/work-corpus/$target"
  if ! "$fuzz/tests/fuzz/h2o-fuzz-$target" -max_total_time="$fuzz_seconds" -timeout=20 -print_final_stats=1 \
      -artifact_prefix="$fuzz/artifacts/$target-" "$fuzz/work-corpus/$target" "$fuzz/tests/fuzz/corpus/$target" \
      >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "== fuzzing $target found a failure (log: $log)"
    return 1
  fi
  echo "== fuzzing $target:"
  grep -E '^(stat::|Done)' "$log"
}
mkdir -p "$fuzz/artifacts"
pids=()
for target in gguf_load text snapshot_read bpe_tokenizer hf_tokenizer chat_request grammar tool_calls; do
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
  fuzz_one "$target" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
stage "fuzzing (gguf_load, text, snapshot_read, bpe_tokenizer, hf_tokenizer, chat_request, grammar, tool_calls)"

echo "== ThreadSanitizer: eight sessions on one model, h2o-server's store under concurrent requests"
tsan="$prefix-tsan"
cmake -S "$root" -B "$tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DH2O_BUILD_TOOLS=OFF -DH2O_VULKAN=OFF -DH2O_CUDA=OFF \
  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_C_FLAGS=-fsanitize=thread \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build "$tsan" -j"$jobs" --target h2o-thread-tests
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "$tsan/tests/h2o-thread-tests"
stage "ThreadSanitizer build and the multi-threaded tests"

echo "== CI matrix finished in $((SECONDS - start)) s"
