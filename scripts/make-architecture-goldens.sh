#!/usr/bin/env bash
# Makes the llama.cpp goldens of tests/data/architecture_goldens again (its README describes the
# models, the prompts and what each line holds): builds the golden maker
# (tools/llama_golden/llama_golden.cpp) against a llama.cpp checkout built in LLAMA_CPP/build,
# writes the models with h2o-synth, and runs the maker on each. The goldens go to OUT_DIR; compare
# them with the committed ones (`diff -r OUT_DIR tests/data/architecture_goldens`), or copy them
# there when the models or the prompts changed on purpose.
#
# Usage: scripts/make-architecture-goldens.sh BUILD_DIR LLAMA_CPP OUT_DIR
#   BUILD_DIR  an h2o build with its tools (h2o-synth)
#   LLAMA_CPP  a llama.cpp checkout, built (CPU) in LLAMA_CPP/build: include/, ggml/include/, build/bin/libllama.so
#   OUT_DIR    where the models, the maker and the goldens are written
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -eq 3 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
build="$1" llama="$(cd "$2" && pwd)" out="$3"
vocab="${H2O_SHARED_DIR:-$root/../shared}/vocab"
data="$root/tests/data/architecture_goldens"
mkdir -p "$out"
c++ -O2 -std=c++17 "$root/tools/llama_golden/llama_golden.cpp" -I"$llama/include" -I"$llama/ggml/include" -L"$llama/build/bin" \
  -lllama -lggml -lggml-base -Wl,-rpath,"$llama/build/bin" -o "$out/llama_golden"
echo "golden maker built against llama.cpp $(git -C "$llama" rev-parse HEAD 2>/dev/null || echo '(not a git checkout)')"

synth() { "$build/tools/h2o-synth" -o "$out/$1.gguf" --type F32 "${@:2}" 2>/dev/null; }
# The synthetic 2000-token vocabulary.
synth llama3 --arch llama --dim 256 --layers 4 --heads 8 --kv-heads 2 --ff 512 --vocab 2000 --tied --embd-scale 0.0625 \
  --rope-freqs --rope-base 500000
synth qwen2 --arch qwen2 --dim 256 --layers 4 --heads 4 --kv-heads 2 --ff 512 --vocab 2000 --rope-base 1000000
synth qwen3 --arch qwen3 --dim 256 --layers 4 --heads 8 --kv-heads 4 --head-dim 64 --ff 512 --vocab 2000 --tied \
  --embd-scale 0.0625 --rope-base 1000000
synth phi3 --arch phi3 --dim 256 --layers 4 --heads 8 --kv-heads 2 --ff 512 --vocab 2000 --rope-dims 16 --ctx 4096
synth phi3-longrope --arch phi3 --dim 256 --layers 4 --heads 8 --kv-heads 4 --ff 512 --vocab 2000 --tied --embd-scale 0.0625 \
  --ctx 4096 --long-rope 256 --seed 7
synth gemma3 --arch gemma3 --dim 256 --layers 6 --heads 4 --kv-heads 1 --head-dim 64 --ff 512 --vocab 2000 --tied \
  --embd-scale 0.0625 --rope-base 1000000 --window 8 --window-pattern 3
synth gemma2 --arch gemma2 --dim 256 --layers 4 --heads 8 --kv-heads 4 --head-dim 32 --ff 512 --vocab 2000 --tied \
  --embd-scale 0.0625 --window 8 --attn-softcap 1.5 --final-softcap 2
# Real vocabularies.
synth gemma3-real --arch gemma3 --dim 64 --layers 6 --heads 4 --kv-heads 1 --head-dim 32 --ff 128 --vocab "$vocab/gemma3" \
  --tied --embd-scale 0.125 --rope-base 1000000 --window 8 --window-pattern 3
synth gemma2-real --arch gemma2 --dim 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 16 --ff 128 --vocab "$vocab/gemma3" \
  --tied --embd-scale 0.125 --window 8 --attn-softcap 1.5 --final-softcap 2
synth phi3-real --arch phi3 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab "$vocab/ggml-vocab-phi-3.gguf" \
  --rope-dims 16 --ctx 4096
synth phi4mini-real --arch phi3 --dim 64 --layers 4 --heads 4 --kv-heads 2 --ff 128 --vocab "$vocab/gpt4o" --tied \
  --embd-scale 0.125 --rope-dims 12 --ctx 4096 --long-rope 256 --seed 7

golden() { "$out/llama_golden" -m "$out/$1.gguf" -n 32 -k 16 --kv-type f32 --escapes "${@:3}" > "$out/$2.jsonl"; }
for m in llama3 qwen2 qwen3 phi3 gemma3 gemma2; do golden $m $m -f "$data/prompts.txt"; done
golden phi3-longrope phi3-longrope-256 -f "$data/prompts.txt" -c 256
golden phi3-longrope phi3-longrope-512 -f "$data/prompts.txt" -c 512
for m in gemma3-real gemma2-real phi3-real; do golden $m $m -f "$data/prompts-chat.txt"; done
golden phi4mini-real phi4mini-real -f "$data/prompts-chat.txt" --chat-template phi3 -c 512
echo "goldens in $out"
