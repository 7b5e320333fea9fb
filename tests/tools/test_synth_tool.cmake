# h2o-synth writes each architecture the runtime runs, with a synthetic vocabulary or a real one
# from a tokenizer.json or a GGUF file, and what it writes loads and generates: h2o-info shows the shape, h2o-cli
# generates, and h2o-chat talks to the real-vocabulary ones in their own template's format. Then its
# usage errors. Arguments: -DSYNTH= -DINFO= -DCLI= -DCHAT= (the programs),
# -DSHARED=<the shared data folder>, -DWORK=<a scratch folder>.
file(MAKE_DIRECTORY "${WORK}")

# Writes a model with `args`, then checks that h2o-info's output matches every regex of `expected`
# and that h2o-cli generates 8 tokens from it.
function(check_model name args expected)
  set(model "${WORK}/${name}.gguf")
  execute_process(COMMAND ${SYNTH} -o ${model} --type F16 --layers 2 --ff 256 ${args} ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "h2o-synth ${args} failed (${rc}): ${err}")
  endif()
  execute_process(COMMAND ${INFO} ${model} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  foreach(regex IN LISTS expected)
    if(NOT rc EQUAL 0 OR NOT out MATCHES "${regex}")
      message(FATAL_ERROR "h2o-info on the model of h2o-synth ${args}: expected '${regex}', got ${rc}:\n${out}${err}")
    endif()
  endforeach()
  execute_process(COMMAND ${CLI} -m ${model} -p "Once upon a time" -n 8 --temp 0 -t 1 OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT err MATCHES "generation: 8 tokens")
    message(FATAL_ERROR "h2o-cli on the model of h2o-synth ${args} failed (${rc}):\n${out}${err}")
  endif()
endfunction()

check_model(synth-llama3 "--dim;128;--heads;4;--kv-heads;1;--vocab;1000;--tied;--rope-freqs;--rope-base;500000"
            "architecture: llama;attention heads: 4, kv heads 1, head dim 32;vocabulary: 1000 tokens")
check_model(synth-qwen2 "--arch;qwen2;--dim;128;--heads;2;--kv-heads;2;--vocab;700"
            "architecture: qwen2;head dim 64;vocabulary: 700 tokens")
check_model(synth-qwen3 "--arch;qwen3;--dim;128;--heads;4;--kv-heads;2;--head-dim;64;--vocab;500;--tied"
            "architecture: qwen3;attention heads: 4, kv heads 2, head dim 64")
check_model(synth-gemma3 "--arch;gemma3;--dim;128;--heads;4;--kv-heads;1;--head-dim;64;--vocab;600;--tied;--window;8"
            "architecture: gemma3;attention heads: 4, kv heads 1, head dim 64")
check_model(synth-gemma2 "--arch;gemma2;--dim;128;--heads;4;--kv-heads;2;--vocab;600;--tied;--window;8;--attn-softcap;50;--final-softcap;30"
            "architecture: gemma2;attention heads: 4, kv heads 2, head dim 32")
check_model(synth-phi3 "--arch;phi3;--dim;128;--heads;4;--kv-heads;4;--vocab;600;--rope-dims;16;--ctx;8192;--long-rope;1024"
            "architecture: phi3;attention heads: 4, kv heads 4, head dim 32;context length: 8192")
# Real vocabularies, when the shared data is here: Qwen3's (ChatML) and Llama 3's tokenizer.json.
if(EXISTS "${SHARED}/vocab/qwen3/tokenizer.json" AND EXISTS "${SHARED}/vocab/llama3/tokenizer.json")
  check_model(synth-qwen3-vocab "--arch;qwen3;--dim;128;--heads;2;--kv-heads;1;--head-dim;128;--tied;--vocab;${SHARED}/vocab/qwen3/tokenizer.json"
              "architecture: qwen3;vocabulary: 151669 tokens;chat format: chatml")
  check_model(synth-llama3-vocab "--dim;128;--heads;2;--kv-heads;1;--tied;--rope-freqs;--vocab;${SHARED}/vocab/llama3"
              "architecture: llama;vocabulary: 128256 tokens;BOS 128000;chat format: llama3")
  # Phi-4-mini's shape in small: GPT-4o's 200k vocabulary, tied, 48 of 64 dimensions rotated, LongRoPE.
  if(EXISTS "${SHARED}/vocab/gpt4o/tokenizer.json")
    check_model(synth-phi4-vocab "--arch;phi3;--dim;128;--heads;2;--kv-heads;1;--rope-dims;48;--tied;--ctx;131072;--long-rope;4096;--vocab;${SHARED}/vocab/gpt4o"
                "architecture: phi3;vocabulary: 200019 tokens")
  endif()
  # Gemma 3's sentencepiece vocabulary, local layers of a 16-token window.
  if(EXISTS "${SHARED}/vocab/gemma3/tokenizer.json")
    check_model(synth-gemma3-vocab "--arch;gemma3;--dim;128;--heads;4;--kv-heads;1;--head-dim;64;--tied;--window;16;--vocab;${SHARED}/vocab/gemma3"
                "architecture: gemma3;vocabulary: 262145 tokens;BOS 2;chat format: gemma")
  endif()
  # Phi-3's sentencepiece vocabulary and chat template, copied from a vocabulary-only GGUF file.
  if(EXISTS "${SHARED}/vocab/ggml-vocab-phi-3.gguf")
    check_model(synth-phi3-vocab "--arch;phi3;--dim;128;--heads;4;--kv-heads;4;--vocab;${SHARED}/vocab/ggml-vocab-phi-3.gguf"
                "architecture: phi3;vocabulary: 32064 tokens;BOS 1;chat format: phi3")
  endif()
  # h2o-chat talks to each in the format of its own template: one turn, then /quit.
  set(chat_cases "synth-qwen3-vocab=chatml" "synth-llama3-vocab=llama3")
  if(EXISTS "${SHARED}/vocab/gemma3/tokenizer.json")
    list(APPEND chat_cases "synth-gemma3-vocab=gemma")
  endif()
  if(EXISTS "${SHARED}/vocab/ggml-vocab-phi-3.gguf")
    list(APPEND chat_cases "synth-phi3-vocab=phi3")
  endif()
  foreach(case IN LISTS chat_cases)
    string(REPLACE "=" ";" case "${case}")
    list(GET case 0 name)
    list(GET case 1 format)
    execute_process(COMMAND sh -c "printf 'Hello\\n/quit\\n' | \"$0\" \"$1\" --budget 64" ${CHAT} ${WORK}/${name}.gguf
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT err MATCHES "chat format ${format}, from the model's template" OR NOT out MATCHES "> .*> ")
      message(FATAL_ERROR "h2o-chat on ${name}: expected exit 0, format ${format} and two prompts, got ${rc}:\n${out}${err}")
    endif()
  endforeach()
else()
  message("H2O-SKIP: ${SHARED}/vocab is absent: the real vocabularies were not tried")
endif()

# Usage errors: one line, exit status 2.
foreach(case "--arch;gemma4;unknown architecture 'gemma4'" "--arch;qwen2;--rope-freqs;--rope-freqs belongs to --arch llama"
             "--window;8;--window, --window-pattern and the soft-caps belong to --arch gemma2 and gemma3"
             "--long-rope;64;--long-rope belongs to --arch phi3"
             "--vocab;vocab.txt;--vocab needs a number, a tokenizer.json \\(or its folder\\) or a GGUF file" "--rope-base;0;--rope-base needs a number > 0"
             "--head-dim;1;--head-dim needs a whole number from 2" "--embd-scale;-1;--embd-scale needs a number > 0")
  list(POP_BACK case expected)
  execute_process(COMMAND ${SYNTH} -o ${WORK}/never.gguf ${case} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "^h2o-synth: .*${expected}")
    message(FATAL_ERROR "h2o-synth ${case}: expected exit 2 and '${expected}', got ${rc}:\n${err}${out}")
  endif()
endforeach()
