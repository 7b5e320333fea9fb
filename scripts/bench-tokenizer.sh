#!/usr/bin/env bash
# Tokenization speed, h2o against llama.cpp, one thread, on ../shared/data/tinystories_val.txt
# repeated to 1 MiB (cut at a line end). Both sides time the library call on the same
# vocabulary-only GGUF files (h2o's Tokenizer::encode, llama.cpp's llama_tokenize; no BOS, special
# tokens not parsed), interleaved: ROUNDS rounds of one llama.cpp and one h2o process, each timing
# 6 calls and dropping the first. Prints the median, minimum and maximum of wall and thread CPU time.
#
# Usage: scripts/bench-tokenizer.sh BUILD_DIR LLAMA_CPP_DIR VOCAB_DIR [ROUNDS]
#   BUILD_DIR      an h2o build configured with -DH2O_CUDA=OFF (its libh2o-llm-static.a is linked)
#   LLAMA_CPP_DIR  a llama.cpp checkout built in LLAMA_CPP_DIR/build (bin/libllama.so)
#   VOCAB_DIR      llama3.gguf and qwen3.gguf, written as tests/data/tokenizer_parity/README.md says
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 3 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
build="$1" llama="$2" vocab="$3" rounds="${4:-5}"
text_source="${H2O_SHARED_DIR:-$root/../shared}/data/tinystories_val.txt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

g++ -O2 -std=c++20 -I"$root/lib" -I"$root/include" "$root/scripts/bench_tokenizer/h2o_tokenize_time.cpp" \
  "$build/libh2o-llm-static.a" $(pkg-config --libs sentencepiece libzstd libpcre2-8) -lpthread -ldl -o "$work/h2o"
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$root/scripts/bench_tokenizer/llama_tokenize_time.cpp" \
  -L"$llama/build/bin" -lllama -Wl,-rpath,"$llama/build/bin" -o "$work/llama"
python3 - "$text_source" "$work/text.txt" <<'PY'
import sys
text = open(sys.argv[1], 'rb').read()
out = text
while len(out) < 1 << 20:
    out += text
out = out[:1 << 20]
open(sys.argv[2], 'wb').write(out[:out.rfind(b'\n') + 1])
PY
echo "text: $(wc -c <"$work/text.txt") bytes; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for v in llama3 qwen3; do
  for _ in $(seq "$rounds"); do
    "$work/llama" "$vocab/$v.gguf" "$work/text.txt" 6 | tail -n 5 | sed "s/^/$v llama.cpp /"
    "$work/h2o" "$vocab/$v.gguf" "$work/text.txt" 6 | tail -n 5 | sed "s/^/$v h2o /"
  done
done >"$work/times"
python3 - "$work/times" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    vocab, tool, wall, cpu, tokens = line.split()
    runs[vocab, tool].append((float(wall), float(cpu), int(tokens)))
for (vocab, tool), r in sorted(runs.items()):
    wall, cpu = sorted(x[0] for x in r), sorted(x[1] for x in r)
    print(f'{vocab:7} {tool:9} {r[0][2]} tokens, {len(r)} calls: wall median {statistics.median(wall):7.1f} ms '
          f'({wall[0]:.1f}-{wall[-1]:.1f}), CPU median {statistics.median(cpu):7.1f} ms ({cpu[0]:.1f}-{cpu[-1]:.1f})')
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
