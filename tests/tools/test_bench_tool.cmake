# Runs h2o-bench --json on the real model and checks its lines; --json with --state is a usage
# error. Arguments: -DBENCH=<h2o-bench> -DMODEL=<gguf> [-DSANITIZED=ON]. Timings are printed, never judged.
if(NOT EXISTS "${MODEL}")
  message("H2O-SKIP: ${MODEL} is absent")
  return()
endif()

execute_process(COMMAND ${BENCH} -m ${MODEL} -p 32 -n 8 -r 2 -t 1 --kv-budget 16 --rolling --json
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "h2o-bench --json failed (${rc}): ${err}")
endif()
string(STRIP "${out}" out)
string(REPLACE "\n" ";" lines "${out}")
set(tests "")
foreach(line IN LISTS lines)
  string(JSON test ERROR_VARIABLE json_error GET "${line}" test)
  if(json_error)
    message(FATAL_ERROR "not a JSON line (${json_error}): ${line}")
  endif()
  list(APPEND tests "${test}")
  if(test STREQUAL "peak_rss")
    continue()
  endif()
  string(JSON median GET "${line}" tokens_per_second median)
  string(JSON low GET "${line}" tokens_per_second min)
  string(JSON high GET "${line}" tokens_per_second max)
  string(JSON samples LENGTH "${line}" tokens_per_second samples)
  string(JSON policy GET "${line}" kv_policy)
  string(JSON budget GET "${line}" kv_budget)
  if(NOT samples EQUAL 2 OR low GREATER median OR median GREATER high OR NOT low GREATER 0)
    message(FATAL_ERROR "inconsistent figures: ${line}")
  endif()
  if(NOT policy STREQUAL "scissorhands" OR NOT budget EQUAL 16)
    message(FATAL_ERROR "the line does not describe the session: ${line}")
  endif()
endforeach()
if(NOT tests STREQUAL "pp32;tg8;peak_rss")
  message(FATAL_ERROR "unexpected measurements: ${tests}")
endif()

# A default session of 64 slots decodes 2000 tokens: it evicts all but 64 of them, and its resident
# memory after the first eviction and at the end are reported; they stay within 5% (the benchmark
# of docs/PERFORMANCE.md measures a million tokens). Under AddressSanitizer freed memory is held
# back (its quarantine), so resident memory grows whatever the program does: only the count is
# checked there.
# Runs h2o-bench --json with the arguments after `test` and sets `line` to its JSON line of that
# test (tg2000, ...), failing when the run fails or prints none.
function(bench_line test line)
  execute_process(COMMAND ${BENCH} -m ${MODEL} ${ARGN} --json OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  string(REGEX MATCH "{\"test\":\"${test}\"[^\n]*" found "${out}")
  if(NOT rc EQUAL 0 OR found STREQUAL "")
    message(FATAL_ERROR "h2o-bench ${ARGN} failed (${rc}): ${err}${out}")
  endif()
  set(${line} "${found}" PARENT_SCOPE)
endfunction()
bench_line(tg2000 tg -p 0 -n 2000 -c 64 -r 1 -t 1)
string(JSON evicted GET "${tg}" evicted_tokens)
string(JSON rss_filled GET "${tg}" rss_after_fill_bytes)
string(JSON rss_end GET "${tg}" rss_end_bytes)
math(EXPR rss_bound "${rss_filled} + ${rss_filled} / 20")
if(SANITIZED)
  set(rss_bound "${rss_end}")
endif()
if(NOT evicted EQUAL 1936 OR NOT rss_filled GREATER 0 OR rss_end GREATER rss_bound)
  message(FATAL_ERROR "an endless session of 64 slots over 2000 tokens: expected 1936 evicted and flat memory: ${tg}")
endif()

# Without -c, an endless session's context holds the whole run: decoding at a depth with no
# prompt evicts nothing.
bench_line(tg8 tg -p 0 -n 8 --depth 16 -r 1 -t 1)
string(JSON evicted GET "${tg}" evicted_tokens)
if(NOT evicted EQUAL 0)
  message(FATAL_ERROR "a run without -c evicted tokens: ${tg}")
endif()

execute_process(COMMAND ${BENCH} -m ${MODEL} --json --state OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--json reports")
  message(FATAL_ERROR "h2o-bench --json --state: expected exit 2 and a message, got ${rc}: ${err}")
endif()
message(STATUS "h2o-bench --json: ${tests}")
