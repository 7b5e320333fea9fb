# Runs h2o-eval on the real model with small settings and checks its JSON lines, then checks that
# usage errors exit with code 2. Arguments: -DEVAL=<h2o-eval> -DMODEL=<gguf> -DTEXT=<text file>.
if(NOT EXISTS "${MODEL}" OR NOT EXISTS "${TEXT}")
  message("H2O-SKIP: ${MODEL} or ${TEXT} is absent")
  return()
endif()

# Runs h2o-eval with the arguments after `what`; fails unless it exits with 0. Sets `lines` to
# its output's lines and `err` to its stderr.
function(run_eval what)
  execute_process(COMMAND ${EVAL} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "h2o-eval ${what} failed (${rc}): ${err}")
  endif()
  string(STRIP "${out}" out)
  string(REPLACE "\n" ";" out "${out}")
  set(lines "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

# Reads the keys after `what` from a JSON line into the caller's variables of their names.
function(read_json line what)
  foreach(key ${ARGN})
    string(JSON value ERROR_VARIABLE json_error GET "${line}" ${key})
    if(json_error)
      message(FATAL_ERROR "bad ${what} JSON line (${json_error}): ${line}")
    endif()
    set(${key} "${value}" PARENT_SCOPE)
  endforeach()
endfunction()

# Checks that the JSON lines of a chunk-mode run are the rows `expected` (policy/budget, in
# order), each with `tokens` scored tokens and a plausible perplexity.
function(check_rows lines what tokens_expected expected)
  set(seen "")
  foreach(line IN LISTS lines)
    read_json("${line}" ${what} policy budget tokens ppl)
    if(NOT tokens EQUAL tokens_expected OR NOT (ppl GREATER 1 AND ppl LESS 20))
      message(FATAL_ERROR "${what}: ${policy}: expected ${tokens_expected} plausibly scored tokens: ${line}")
    endif()
    list(APPEND seen "${policy}/${budget}")
  endforeach()
  if(NOT seen STREQUAL "${expected}")
    message(FATAL_ERROR "unexpected ${what} rows: ${seen}")
  endif()
endfunction()

run_eval("" -m ${MODEL} -f ${TEXT} --chunks 1 --chunk 128 --budgets 32 --policies full,h2o,window --json --quiet -t 1)
if(NOT err STREQUAL "")
  message(FATAL_ERROR "h2o-eval --quiet wrote to stderr: ${err}")
endif()
list(LENGTH lines n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "expected 3 JSON lines (full, h2o/32, window/32), got ${n}:\n${lines}")
endif()

set(seen "")
foreach(line IN LISTS lines)
  read_json("${line}" "chunk-mode" policy budget tokens mean_nll ppl greedy_agreement)
  list(APPEND seen "${policy}/${budget}")
  if(NOT tokens EQUAL 127)
    message(FATAL_ERROR "${policy}: scored ${tokens} tokens, expected 127: ${line}")
  endif()
  # A trained model beats the uniform guess (vocab 512) by far; agreement is a fraction.
  if(NOT (ppl GREATER 1 AND ppl LESS 20 AND mean_nll GREATER 0))
    message(FATAL_ERROR "${policy}: implausible perplexity: ${line}")
  endif()
  if(greedy_agreement LESS 0.5 OR greedy_agreement GREATER 1)
    message(FATAL_ERROR "${policy}: implausible greedy agreement: ${line}")
  endif()
  if(policy STREQUAL "full" AND NOT greedy_agreement EQUAL 1)
    message(FATAL_ERROR "the full cache must agree with itself: ${line}")
  endif()
endforeach()
if(NOT seen STREQUAL "full/128;h2o/32;window/32")
  message(FATAL_ERROR "unexpected rows: ${seen}")
endif()

# Stream mode on a text shorter than the stream (it goes round again), with the tail compared
# with its in-context perplexity, and the horizon each policy resolves to.
file(READ "${TEXT}" text LIMIT 600)
string(FIND "${text}" "\n" last_newline REVERSE)  # whole lines: no UTF-8 sequence is cut
string(SUBSTRING "${text}" 0 ${last_newline} text)
set(short_text "${CMAKE_CURRENT_BINARY_DIR}/eval_short_text.txt")
file(WRITE "${short_text}" "${text}")
run_eval(--stream -m ${MODEL} -f ${short_text} --stream 400 --segment 100 --tail 1 --context 64 --budgets 32
         --policies scissorhands,window --json --quiet -t 1)
list(LENGTH lines n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "expected 2 JSON lines (scissorhands/32, window/32), got ${n}:\n${lines}")
endif()
foreach(line IN LISTS lines)
  read_json("${line}" stream policy horizon tokens tail_first_token tail_ppl tail_in_context_ppl tail_greedy_agreement)
  if(NOT tokens EQUAL 400 OR NOT tail_first_token EQUAL 301)
    message(FATAL_ERROR "${policy}: expected 400 tokens and a tail from 301: ${line}")
  endif()
  if(NOT (tail_ppl GREATER 1 AND tail_ppl LESS 20 AND tail_in_context_ppl GREATER 1 AND tail_in_context_ppl LESS 20))
    message(FATAL_ERROR "${policy}: implausible tail perplexities: ${line}")
  endif()
  if(tail_greedy_agreement LESS 0.5 OR tail_greedy_agreement GREATER 1)
    message(FATAL_ERROR "${policy}: implausible greedy agreement with the in-context reference: ${line}")
  endif()
  # The default horizon: 1.5 budgets for scissorhands; none for a window.
  if((policy STREQUAL "scissorhands" AND NOT horizon EQUAL 48) OR (policy STREQUAL "window" AND NOT horizon EQUAL 0))
    message(FATAL_ERROR "${policy}: unexpected horizon ${horizon}: ${line}")
  endif()
endforeach()
execute_process(COMMAND ${EVAL} -m ${MODEL} -f ${short_text} --stream 100 --budgets 32 --policies h2o --horizon 20 --quiet -t 1
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 1 OR NOT err MATCHES "kv_horizon 20 is smaller than kv_budget 32")
  message(FATAL_ERROR "h2o-eval --horizon 20 --budgets 32: expected exit 1 and the library's message, got ${rc}: ${err}")
endif()

# llama.cpp's context shift as a policy: until 128 slots fill (BOS and the first segment's 100
# tokens) it computes what a window computes; from its first shift on (half the cache at once)
# it does not.
run_eval(--shift -m ${MODEL} -f ${short_text} --stream 300 --segment 100 --budgets 128 --policies window,shift --json --quiet -t 1)
read_json("${lines}" shift-window policy segment_ppl)
set(window_segments "${segment_ppl}")
list(GET lines 1 shift_line)
read_json("${shift_line}" shift policy tokens segment_ppl)
string(JSON window_first GET "${window_segments}" 0)
string(JSON shift_first GET "${segment_ppl}" 0)
string(JSON window_last GET "${window_segments}" 2)
string(JSON shift_last GET "${segment_ppl}" 2)
if(NOT policy STREQUAL "shift" OR NOT tokens EQUAL 300 OR NOT shift_first STREQUAL window_first OR shift_last STREQUAL window_last
   OR NOT (shift_last GREATER 1 AND shift_last LESS 20))
  message(FATAL_ERROR "h2o-eval shift: expected the window's first segment and a plausible, different last one: ${lines}")
endif()

# The oracle evicts by the attention each token will still receive in a full-cache pass: at the
# same budget it must beat the window by far, and the report measures each policy against the two.
run_eval(--oracle -m ${MODEL} -f ${TEXT} --chunks 1 --chunk 128 --budgets 32 --policies oracle,window,h2o --json --quiet -t 1)
set(seen "")
foreach(line IN LISTS lines)
  read_json("${line}" oracle policy ppl oracle_gap_closed_pct)
  set(${policy}_ppl ${ppl})
  set(${policy}_gap ${oracle_gap_closed_pct})
  list(APPEND seen "${policy}")
endforeach()
if(NOT (oracle_ppl GREATER 1 AND window_ppl GREATER oracle_ppl) OR NOT seen STREQUAL "oracle;window;h2o" OR NOT oracle_gap EQUAL 100
   OR NOT window_gap EQUAL 0)
  message(FATAL_ERROR "h2o-eval oracle: expected it below the window, and the gap shares 100 and 0: ${lines}")
endif()
execute_process(COMMAND ${EVAL} -m ${MODEL} -f ${TEXT} --stream 100 --policies oracle --quiet -t 1
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "the oracle runs in chunk mode")
  message(FATAL_ERROR "h2o-eval --stream with the oracle: expected exit 2 and why, got ${rc}: ${err}")
endif()

# The prompt protocol: each chunk's first 64 tokens read as one prompt, ranked by a proxy of 16
# queries while evicting; the other 64 scored.
run_eval(--prompt -m ${MODEL} -f ${TEXT} --chunks 1 --chunk 128 --budgets 32 --policies full,h2o --prompt 64
         --prompt-proxy 16 --prompt-random-share 0.1 --json --quiet -t 1)
check_rows("${lines}" prompt-protocol 64 "full/128;h2o/32")
execute_process(COMMAND ${EVAL} -m ${MODEL} -f ${TEXT} --chunks 1 --chunk 128 --budgets 32 --policies window --prompt 64
                        --prompt-proxy 16 --quiet -t 1
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 1 OR NOT err MATCHES "kv_prompt_proxy needs a policy that gathers attention statistics")
  message(FATAL_ERROR "h2o-eval --prompt-proxy with a window: expected exit 1 and the library's message, got ${rc}: ${err}")
endif()

# Budgets per kv head for the policies that gather statistics; the window keeps its fixed budget
# (the library would refuse the share for it).
run_eval(--head-share -m ${MODEL} -f ${TEXT} --chunks 1 --chunk 128 --budgets 32 --policies h2o,window --head-share 0.5 --json --quiet -t 1)
check_rows("${lines}" head-share 127 "h2o/32;window/32")
# And on a stream, whose rolling positions are then each head's own ranks.
run_eval(--stream-head-share -m ${MODEL} -f ${short_text} --stream 300 --segment 100 --tail 1 --context 64 --budgets 32
         --policies scissorhands --head-share 0.5 --json --quiet -t 1)
read_json("${lines}" stream-head-share policy tokens tail_ppl)
if(NOT policy STREQUAL "scissorhands" OR NOT tokens EQUAL 300 OR NOT (tail_ppl GREATER 1 AND tail_ppl LESS 20))
  message(FATAL_ERROR "h2o-eval --stream --head-share: expected scissorhands over 300 tokens, a plausible tail: ${lines}")
endif()

# Retention mode: the two references and each configuration with the first passage pinned or not.
run_eval(--retention -m ${MODEL} -f ${TEXT} --retention 40 --trials 2 --passage 12 --budgets 32 --policies window --json --quiet -t 1)
set(seen "")
foreach(line IN LISTS lines)
  read_json("${line}" retention row other_tokens trials repeat_nll)
  if(NOT other_tokens EQUAL 40 OR NOT trials EQUAL 2 OR NOT (repeat_nll GREATER 0 AND repeat_nll LESS 10))
    message(FATAL_ERROR "implausible retention line: ${line}")
  endif()
  list(APPEND seen "${row}")
endforeach()
if(NOT seen STREQUAL "full cache;unseen (no 1st passage);window/32;window/32 pinned")
  message(FATAL_ERROR "unexpected retention rows: ${seen}")
endif()
# The shift keeps the pinned passage through its shifts; a span's minimum it cannot keep, so it has
# no rows of shares.
run_eval(--retention-shift -m ${MODEL} -f ${TEXT} --retention 60 --trials 2 --passage 12 --budgets 32 --policies shift --min-shares 0.5
         --json --quiet -t 1)
set(seen "")
foreach(line IN LISTS lines)
  read_json("${line}" retention-shift row repeat_nll)
  if(NOT (repeat_nll GREATER 0 AND repeat_nll LESS 10))
    message(FATAL_ERROR "implausible retention line: ${line}")
  endif()
  list(APPEND seen "${row}")
endforeach()
if(NOT seen STREQUAL "full cache;unseen (no 1st passage);shift/32;shift/32 pinned")
  message(FATAL_ERROR "unexpected retention rows for shift: ${seen}")
endif()

# Usage errors: exit code 2 and a message naming the problem.
foreach(case "--policies;full,nonsense;unknown policy" "--budgets;1;at least 2" "--chunk;1;--chunk"
             "--context;1;--context must be 0" "--horizon;1;--horizon needs" "--prompt;600;--prompt must leave"
             "--prompt-random-share;2;--prompt-random-share needs" "--prompt-proxy;5000;--prompt-proxy needs"
             "--head-share;0.95;--head-share needs")
  list(GET case 0 option)
  list(GET case 1 value)
  list(GET case 2 expected)
  execute_process(COMMAND ${EVAL} -m ${MODEL} -f ${TEXT} ${option} ${value}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${expected}")
    message(FATAL_ERROR "h2o-eval ${option} ${value}: expected exit 2 and '${expected}', got ${rc}: ${err}")
  endif()
endforeach()
execute_process(COMMAND ${EVAL} -m ${MODEL} -f ${TEXT}.does-not-exist
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "cannot read")
  message(FATAL_ERROR "h2o-eval with a missing text: expected exit 2, got ${rc}: ${err}")
endif()
message(STATUS "h2o-eval: ${seen}")
