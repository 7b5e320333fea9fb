#!/usr/bin/env bash
# The CI stages beyond the test suites with gcc, gcc + ASan/UBSan and clang (.ci/run runs those,
# and calls this script):
#   1. the fuzz targets with clang + libFuzzer + ASan/UBSan: replay of the generated seed corpus
#      and the saved crash inputs (tests/fuzz/crashes), then $H2O_FUZZ_SECONDS (default 45) of
#      fuzzing per target;
#   2. ThreadSanitizer (gcc): the library and the multi-threaded tests (h2o-thread-tests).
# Each stage prints the seconds it took. Usage: scripts/ci-matrix.sh [BUILD_PREFIX]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${1:-$root/build-ci}"
fuzz_seconds="${H2O_FUZZ_SECONDS:-45}"
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

echo "== fuzz targets (clang, libFuzzer, ASan + UBSan)"
fuzz="$prefix-fuzz"
CC=clang CXX=clang++ cmake -S "$root" -B "$fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DH2O_FUZZ=ON \
  -DH2O_WERROR=ON -DH2O_BUILD_TOOLS=OFF -DH2O_VULKAN=OFF -DH2O_CUDA=OFF >/dev/null
cmake --build "$fuzz" -j"$jobs" --target h2o-fuzz-seeds h2o-fuzz-gguf_load h2o-fuzz-text h2o-fuzz-snapshot_read \
  h2o-fuzz-bpe_tokenizer h2o-fuzz-hf_tokenizer
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The seed corpus is written by the first of these tests; the others replay it and the crashes.
ctest --test-dir "$fuzz" -R '^fuzz_' --output-on-failure
stage "fuzz build and replay"
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
for target in gguf_load text snapshot_read bpe_tokenizer hf_tokenizer; do
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
  fuzz_one "$target" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
stage "fuzzing (gguf_load, text, snapshot_read, bpe_tokenizer, hf_tokenizer)"

echo "== ThreadSanitizer: eight sessions on one model"
tsan="$prefix-tsan"
cmake -S "$root" -B "$tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DH2O_BUILD_TOOLS=OFF -DH2O_VULKAN=OFF -DH2O_CUDA=OFF \
  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_C_FLAGS=-fsanitize=thread \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build "$tsan" -j"$jobs" --target h2o-thread-tests
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "$tsan/tests/h2o-thread-tests"
stage "ThreadSanitizer build and the multi-threaded tests"

echo "== CI matrix finished in $((SECONDS - start)) s"
