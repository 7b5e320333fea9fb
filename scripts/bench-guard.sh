#!/usr/bin/env bash
# The speed guard: this working tree's CPU speed against a release's (or any commit's), on the
# benchmark files of docs/PERFORMANCE.md, interleaved in one run on this machine. Run it before a
# change to kernels, threads or the graph lands, and quote what it prints.
#
# Usage: scripts/bench-guard.sh [REF] [ROUNDS] [THREADS]
#   REF      a tag or commit to compare with (default: the latest release tag, v*)
#   ROUNDS   rounds over the files (default 3)
#   THREADS  threads of both (default 2)
# Environment: H2O_GUARD_DIR (default build-guard/ in the checkout) holds the models (written once,
# about 3 GB) and REF's build; H2O_GUARD_BUILD is the current tree's build (default build/, made by
# scripts/build.sh when it lacks h2o-bench); H2O_GUARD_FILES the files to run, by name (default all
# six: m134-q4_0 m134-q4_k_m m134-q8_0 tl11-q4_0 tl11-q4_k_m tl11-q8_0); H2O_GUARD_FAIL_BELOW a
# ratio (such as 0.95) under which the script exits 1 when a row's ratio of medians falls, so
# that `git bisect run` can use it (with H2O_GUARD_BUILD the bisected tree's build).
#
# The files: the 134M shape (h2o-synth's default: dim 768, 12 layers, vocabulary 32000) and
# TinyLlama 1.1B's (dim 2048, 22 layers, 32 heads on 4 kv heads, FFN 5632) in F16, quantized by
# this tree's h2o-quantize to Q4_0, Q4_K_M and Q8_0; both builds read the same files. Each round
# runs every file with both builds, in alternating order (`h2o-bench -p 512 -n 128 -r 1 -t
# THREADS --json`); the table has each side's median and spread of the rounds and the ratio of
# the medians with its range over the rounds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ref="${1:-}" rounds="${2:-3}" threads="${3:-2}"
work="${H2O_GUARD_DIR:-$root/build-guard}"
current="${H2O_GUARD_BUILD:-$root/build}"
if [ -z "$ref" ]; then
  ref="$(git -C "$root" describe --tags --abbrev=0 --match 'v*' 2>/dev/null)" ||
    { echo "bench-guard: no release tag (v*) in this clone: give a tag or commit" >&2; exit 2; }
fi
commit="$(git -C "$root" rev-parse --verify --quiet "$ref^{commit}")" ||
  { echo "bench-guard: '$ref' is not a commit of this repository" >&2; exit 2; }
short="${commit:0:9}"
mkdir -p "$work/models"

# REF's tree, exported (not checked out: the working tree stays as it is) and built once.
base="$work/$short"
if [ ! -x "$base/build/tools/h2o-bench" ]; then
  rm -rf "$base" && mkdir -p "$base/src"
  git -C "$root" archive "$commit" | tar -x -C "$base/src"
  echo "bench-guard: building $ref ($short) in $base (a few minutes)"
  # The CPU backend is what is measured: no CUDA code, no tests.
  cmake -S "$base/src" -B "$base/build" -DCMAKE_BUILD_TYPE=Release -DH2O_CUDA=OFF -DH2O_BUILD_TESTS=OFF >"$base/build.log" 2>&1 &&
    cmake --build "$base/build" -j"$(nproc)" --target h2o-bench >>"$base/build.log" 2>&1 ||
    { tail -20 "$base/build.log" >&2; echo "bench-guard: the build of $ref failed ($base/build.log)" >&2; exit 1; }
fi
if [ ! -x "$current/tools/h2o-bench" ] || [ ! -x "$current/tools/h2o-quantize" ]; then
  H2O_BUILD_TARGETS="h2o-bench h2o-synth h2o-quantize" "$root/scripts/build.sh" "$current" >/dev/null
fi

declare -A shapes=([m134]="" [tl11]="--dim 2048 --layers 22 --heads 32 --kv-heads 4 --ff 5632")
for shape in m134 tl11; do
  f16="$work/models/$shape-f16.gguf"
  if [ ! -s "$f16" ]; then
    # shellcheck disable=SC2086  # the options are meant to be split
    "$current/tools/h2o-synth" -o "$f16.tmp" --type F16 ${shapes[$shape]} >/dev/null
    mv "$f16.tmp" "$f16"
  fi
  for type in Q4_0 Q4_K_M Q8_0; do
    out="$work/models/$shape-${type,,}.gguf"
    if [ ! -s "$out" ]; then
      "$current/tools/h2o-quantize" "$f16" "$out.tmp" "$type" >/dev/null
      mv "$out.tmp" "$out"
    fi
  done
done

names="${H2O_GUARD_FILES:-m134-q4_0 m134-q4_k_m m134-q8_0 tl11-q4_0 tl11-q4_k_m tl11-q8_0}"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "bench-guard: $(git -C "$root" describe --always --dirty) against $ref ($short) on $cpu, $threads threads, $rounds rounds"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
times="$(mktemp)"
trap 'rm -f "$times"' EXIT
run() {  # run SIDE BUILD NAME
  "$2/tools/h2o-bench" -m "$work/models/$3.gguf" -p 512 -n 128 -r 1 -t "$threads" --json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    o = json.loads(line)
    if o.get("test", "")[:2] in ("pp", "tg"):
        print(sys.argv[1], sys.argv[2], sys.argv[3], o["test"], o["tokens_per_second"]["median"], o.get("backend", ""))' "$4" "$1" "$3" >>"$times"
}
for round in $(seq "$rounds"); do
  for name in $names; do
    if [ $((round % 2)) -eq 1 ]; then
      run base "$base/build" "$name" "$round"; run current "$current" "$name" "$round"
    else
      run current "$current" "$name" "$round"; run base "$base/build" "$name" "$round"
    fi
  done
  echo "round $round done"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$times" "$ref" "${H2O_GUARD_FAIL_BELOW:-0}" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(dict)
kernels = {}
for line in open(sys.argv[1]):
    parts = line.split(maxsplit=5)
    rnd, side, name, test, tps = parts[:5]
    runs[name, test][side, int(rnd)] = float(tps)
    kernels[side] = parts[5].strip() if len(parts) > 5 else ""
print("kernels: %s = %s; current = %s" % (sys.argv[2], kernels.get("base", "?"), kernels.get("current", "?")))
print("| file | test | %s tok/s (median, min-max) | current tok/s | current / %s (medians; rounds' range) |" % (sys.argv[2], sys.argv[2]))
print("|---|---|---|---|---|")
slower = False
for (name, test), samples in runs.items():
    base = [v for (s, r), v in samples.items() if s == "base"]
    cur = [v for (s, r), v in samples.items() if s == "current"]
    if not base or not cur:
        continue
    ratios = [samples["current", r] / samples["base", r] for (s, r) in samples if s == "base" and ("current", r) in samples]
    cell = lambda v: "%.1f (%.1f-%.1f)" % (statistics.median(v), min(v), max(v))
    ratio = statistics.median(cur) / statistics.median(base)
    print("| %s | %s | %s | %s | **%.3f** (%.3f-%.3f) |" % (name, test, cell(base), cell(cur), ratio, min(ratios), max(ratios)))
    slower = slower or ratio < float(sys.argv[3])
if slower:
    print("bench-guard: a row is below %s of %s" % (sys.argv[3], sys.argv[2]))
    sys.exit(1)
PY
