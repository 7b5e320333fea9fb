# The command lines of every program: --version and --help answer, and every usage error ends
# with exit status 2 and one line on stderr before anything is loaded (the model given is a path
# that does not exist, so a check made after loading would fail with another status). Then what
# needs the real model: h2o-bench -p 0 -n 0 (once a crash), h2o-info on stories260K, and
# h2o-quantize into a folder that does not exist.
# Arguments: -DCLI= -DBENCH= -DSYNTH= -DQUANTIZE= -DEVAL= -DINFO= -DCHAT= (the programs),
# -DMODEL=<stories260K.gguf>, -DWORK=<a scratch folder>.
set(programs "h2o-cli=${CLI}" "h2o-bench=${BENCH}" "h2o-synth=${SYNTH}" "h2o-quantize=${QUANTIZE}" "h2o-eval=${EVAL}"
             "h2o-info=${INFO}" "h2o-chat=${CHAT}")
set(missing "${WORK}/no-such-model.gguf")
file(MAKE_DIRECTORY "${WORK}")
file(REMOVE "${missing}")

# Runs a program; fails unless it exits with 2 and writes one line to stderr matching `expected`.
function(expect_usage_error name program expected)
  execute_process(COMMAND ${program} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  string(REGEX REPLACE "\n$" "" line "${err}")
  if(NOT rc EQUAL 2 OR line MATCHES "\n" OR NOT line MATCHES "^${name}: .*${expected}" OR NOT out STREQUAL "")
    message(FATAL_ERROR "${name} ${ARGN}: expected exit 2 and one line matching '${expected}', got ${rc}:\n${err}${out}")
  endif()
endfunction()

foreach(entry IN LISTS programs)
  string(REPLACE "=" ";" entry "${entry}")
  list(GET entry 0 name)
  list(GET entry 1 program)
  execute_process(COMMAND ${program} --version OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^${name} [0-9]+\\.[0-9]+\\.[0-9]+\n$")
    message(FATAL_ERROR "${name} --version: expected '${name} MAJOR.MINOR.PATCH', got ${rc}: ${out}${err}")
  endif()
  execute_process(COMMAND ${program} --help OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: ${name}")
    message(FATAL_ERROR "${name} --help: expected exit 0 and the usage on stdout, got ${rc}: ${out}${err}")
  endif()
  expect_usage_error(${name} ${program} "unknown option '--frobnicate'" --frobnicate)
endforeach()

# h2o-cli: sampling values, counts and KV options that cannot work, all before loading.
foreach(case "-n;0;-n needs a whole number from 1" "--temp;-1;--temp needs a number >= 0"
             "--top-p;2;--top-p needs a number in \\(0, 1\\]" "--min-p;1.5;--min-p needs a number in \\[0, 1\\]"
             "--repeat-penalty;0;--repeat-penalty needs a number > 0" "--kv-budget;1;--kv-budget must be 0"
             "--kv-head-share;2;--kv-head-share needs a number in \\[0, 0.9\\]" "--ctx;1;--ctx must be 0"
             "--kv-type;f8;unknown KV type 'f8'" "--backend;tpu;unknown backend 'tpu'" "--seed;-3;--seed needs a whole number")
  list(GET case 0 option)
  list(GET case 1 value)
  list(GET case 2 expected)
  expect_usage_error(h2o-cli ${CLI} "${expected}" -m ${missing} ${option} ${value})
endforeach()
expect_usage_error(h2o-cli ${CLI} "--temp needs a value" -m ${missing} --temp)
expect_usage_error(h2o-cli ${CLI} "--kv-share-across-layers moves the slots of --kv-head-share"
                   -m ${missing} --kv-budget 32 --kv-share-across-layers)
expect_usage_error(h2o-cli ${CLI} "--kv-share-across-layers moves the slots of --kv-head-share" -m ${missing} --kv-share-across-layers)
expect_usage_error(h2o-cli ${CLI} "--kv-policy shapes eviction.*never evicts" -m ${missing} --kv-policy h2o --kv-overflow error)
expect_usage_error(h2o-cli ${CLI} "--kv-overflow takes evict or error, not 'wrap'" -m ${missing} --kv-overflow wrap)
expect_usage_error(h2o-cli ${CLI} "--kv-recent 64 exceeds --kv-budget 32" -m ${missing} --kv-budget 32 --kv-recent 64)
expect_usage_error(h2o-cli ${CLI} "--json takes no value" -m ${missing} --json=1)
execute_process(COMMAND ${CLI} --help OUTPUT_VARIABLE out)
if(NOT out MATCHES "default 0: as many as the context; when" OR NOT out MATCHES "--kv-overflow MODE")
  message(FATAL_ERROR "h2o-cli --help does not say what --kv-budget 0 and --kv-overflow mean:\n${out}")
endif()

# h2o-bench: nothing to measure, and --ttft without the tokens it reads.
expect_usage_error(h2o-bench ${BENCH} "nothing to measure" -m ${missing} -p 0 -n 0)
expect_usage_error(h2o-bench ${BENCH} "--ttft 32 reads 33 tokens" -m ${missing} -p 16 -n 0 --ttft 32)
expect_usage_error(h2o-bench ${BENCH} "-r needs a whole number from 1" -m ${missing} -r 0)
expect_usage_error(h2o-bench ${BENCH} "--kv-head-share needs a number" -m ${missing} --kv-budget 32 --kv-head-share x)

# h2o-synth, h2o-quantize, h2o-eval, h2o-info, h2o-chat.
expect_usage_error(h2o-synth ${SYNTH} "--layers needs a whole number from 1" -o ${WORK}/never.gguf --layers 0)
expect_usage_error(h2o-synth ${SYNTH} "unknown type 'Q3_K'" -o ${WORK}/never.gguf --type Q3_K)
expect_usage_error(h2o-synth ${SYNTH} "-o OUT.gguf is required" --layers 2)
expect_usage_error(h2o-quantize ${QUANTIZE} "expected IN.gguf OUT.gguf TYPE" ${missing} ${WORK}/never.gguf)
expect_usage_error(h2o-quantize ${QUANTIZE} "unknown TYPE 'Q3_K'" ${missing} ${WORK}/never.gguf Q3_K)
expect_usage_error(h2o-quantize ${QUANTIZE} "-t needs a whole number from 1" -t 0 ${missing} ${WORK}/never.gguf Q8_0)
expect_usage_error(h2o-eval ${EVAL} "--head-share needs a number in \\[0, 0.9\\]" -m ${missing} -f ${missing} --head-share 2)
expect_usage_error(h2o-eval ${EVAL} "--across-layers moves" -m ${missing} -f ${missing} --across-layers)
expect_usage_error(h2o-info ${INFO} "give a MODEL, --backends, or both")
expect_usage_error(h2o-info ${INFO} "unexpected argument" ${missing} ${missing})
expect_usage_error(h2o-chat ${CHAT} "--budget needs a whole number from 2" ${missing} --budget 1)
expect_usage_error(h2o-chat ${CHAT} "unknown chat format 'alpaca'" ${missing} --format alpaca)
expect_usage_error(h2o-chat ${CHAT} "--system needs a value" ${missing} --system)
expect_usage_error(h2o-chat ${CHAT} "no model given")

if(NOT EXISTS "${MODEL}")
  message("H2O-SKIP: ${MODEL} is absent (the usage errors above passed)")
  return()
endif()

# h2o-bench -p 0 -n 0 once wrote the first of zero tokens and crashed, with every output form.
foreach(extra "" "--json" "--state" "-r;1")
  expect_usage_error(h2o-bench ${BENCH} "-p 0 and -n 0 leave nothing to measure" -m ${MODEL} -p 0 -n 0 ${extra})
endforeach()

# h2o-info: the model's description through the public API, and the devices.
execute_process(COMMAND ${INFO} ${MODEL} --backends OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "h2o-info failed (${rc}): ${err}")
endif()
foreach(expected "\narchitecture: llama\n" "\ncontext length: 2048 tokens" "\nparameters: [0-9]+ \\(0\\.29 M\\)"
                 "\nlayers: 5, embedding 64, feed-forward 172\n" "\nattention heads: 8, kv heads 4, head dim 8\n"
                 "\nvocabulary: 512 tokens, BOS 1 \"<s>\", EOS 2 \"</s>\"\n" "\nchat format: none: the model has no chat template"
                 "\ncpu +0 +cpu +host +cpu")
  if(NOT out MATCHES "${expected}")
    message(FATAL_ERROR "h2o-info: expected '${expected}' in:\n${out}")
  endif()
endforeach()
execute_process(COMMAND ${INFO} ${missing} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 1 OR NOT err MATCHES "cannot load model")
  message(FATAL_ERROR "h2o-info on a missing file: expected exit 1 and the load error, got ${rc}: ${err}")
endif()

# h2o-quantize into a folder that does not exist: the error before any tensor line.
execute_process(COMMAND ${QUANTIZE} ${MODEL} ${WORK}/no-such-folder/out.gguf Q8_0
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 1 OR NOT err MATCHES "the folder .*no-such-folder does not exist" OR NOT out STREQUAL "")
  message(FATAL_ERROR "h2o-quantize into a missing folder: expected exit 1, the folder named and no tensor converted, got ${rc}:\n${err}${out}")
endif()
message(STATUS "every program answers --version and --help and refuses bad options with exit 2 and one line")
