#!/usr/bin/env bash
# Prompt and decoding speed, h2o against llama.cpp, on the shapes of the small models people
# download: Llama 3.2 1B (dim 2048, 16 layers, 32/8 heads, FFN 8192, the Llama 3 vocabulary of
# 128 256 tokens, tied output, rope_freqs) and Qwen2.5 0.5B (qwen2: dim 896, 24 layers, 14/2
# heads, FFN 4864, the Qwen vocabulary, tied output). Random weights written by h2o-synth in F16,
# quantized by llama.cpp's own llama-quantize (its default mixes, Q4_0 and Q4_K_M), so both
# libraries read the same files. ROUNDS rounds, interleaved: in each, every file once with
# `h2o-bench -p 512 -n 128 -r 1` and once with `llama-bench -p 512 -n 128 -r 1 -mmp 0`, THREADS
# threads. Prints each side's median (lowest-highest) of the rounds and the ratios h2o / llama.cpp.
#
# Usage: scripts/bench-models.sh BUILD_DIR LLAMA_CPP_BIN MODEL_DIR [ROUNDS] [THREADS]
#   BUILD_DIR      an h2o build with its tools (h2o-synth, h2o-bench)
#   LLAMA_CPP_BIN  the folder of llama.cpp's llama-bench and llama-quantize
#   MODEL_DIR      where the models are written (once; about 4 GB), and read again by later runs
#   ROUNDS         default 3; 0 only writes the models
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 3 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
build="$1" llama="$2" models="$3" rounds="${4:-3}" threads="${5:-2}"
vocab="${H2O_SHARED_DIR:-$root/../shared}/vocab"
mkdir -p "$models"

# name: h2o-synth options
declare -A shapes=(
  [llama32-1b]="--arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ff 8192 --tied --rope-freqs
                --rope-base 500000 --vocab $vocab/llama3 --ctx 8192"
  [qwen25-05b]="--arch qwen2 --dim 896 --layers 24 --heads 14 --kv-heads 2 --ff 4864 --tied --rope-base 1000000
                --vocab $vocab/qwen3 --ctx 8192"
)
files=()
for name in llama32-1b qwen25-05b; do
  f16="$models/$name-f16.gguf"
  if [ ! -s "$f16" ]; then
    # shellcheck disable=SC2086  # the options are meant to be split
    "$build/tools/h2o-synth" -o "$f16.tmp" --type F16 --embd-scale 0.03 ${shapes[$name]} >/dev/null
    mv "$f16.tmp" "$f16"
  fi
  for type in Q4_0 Q4_K_M; do
    out="$models/$name-${type,,}.gguf"
    if [ ! -s "$out" ]; then
      "$llama/llama-quantize" "$f16" "$out.tmp" "$type" "$threads" >/dev/null 2>&1
      mv "$out.tmp" "$out"
    fi
    files+=("$out")
  done
done

[ "$rounds" -gt 0 ] || { echo "models written in $models"; exit 0; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $threads threads, $rounds rounds"
times="$(mktemp)"
trap 'rm -f "$times"' EXIT
for round in $(seq "$rounds"); do
  for f in "${files[@]}"; do
    name="$(basename "$f" .gguf)"
    # A file h2o refuses is reported (with the reason) and left out of the table.
    if ! h2o_out="$("$build/tools/h2o-bench" -m "$f" -p 512 -n 128 -r 1 -t "$threads" --json 2>&1)"; then
      [ "$round" -gt 1 ] || echo "$name: h2o refuses it: $h2o_out"
      continue
    fi
    printf '%s\n' "$h2o_out" |
      python3 -c 'import json, sys
for line in sys.stdin:
    o = json.loads(line)
    if o.get("test", "").startswith(("pp", "tg")): print(sys.argv[1], "h2o", o["test"][:2], o["tokens_per_second"]["median"])' "$name" >>"$times"
    "$llama/llama-bench" -m "$f" -p 512 -n 128 -r 1 -t "$threads" -mmp 0 -o csv 2>/dev/null |
      python3 -c 'import csv, sys
for row in csv.DictReader(sys.stdin):
    print(sys.argv[1], "llama.cpp", "pp" if int(row["n_prompt"]) else "tg", row["avg_ts"])' "$name" >>"$times"
  done
  echo "round $round done"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$times" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    model, tool, test, tps = line.split()
    runs[model, tool, test].append(float(tps))
def cell(v):
    v = sorted(v)
    return f'{statistics.median(v):7.1f} ({v[0]:.1f}-{v[-1]:.1f})'
print(f'{"model":20} {"test":5} {"h2o tok/s":24} {"llama.cpp tok/s":24} ratio of medians (per round: lowest-highest)')
for model in sorted({k[0] for k in runs if k[1] == 'h2o'}):
    for test in ('pp', 'tg'):
        h, l = runs[model, 'h2o', test], runs[model, 'llama.cpp', test]
        per_round = sorted(a / b for a, b in zip(h, l))
        print(f'{model:20} {test + ("512" if test == "pp" else "128"):5} {cell(h):24} {cell(l):24} '
              f'{statistics.median(h) / statistics.median(l):.2f} ({per_round[0]:.2f}-{per_round[-1]:.2f})')
PY

# The sampler over these vocabularies, against the decoding time per token above.
g++ -O2 -std=c++20 -I"$root/lib" -I"$root/include" "$root/scripts/bench_sampler/sample_time.cpp" \
  "$build/libh2o-llm-static.a" $(pkg-config --libs sentencepiece libzstd libpcre2-8) -lpthread -ldl -o "$times.sampler"
trap 'rm -f "$times" "$times.sampler"' EXIT
for n_vocab in 128256 151669; do "$times.sampler" "$n_vocab" 200; done
