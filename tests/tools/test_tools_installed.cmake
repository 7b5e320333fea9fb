# The programs are installed together, h2o-chat included, and start from the prefix (they find
# the installed library through their RPATH). Arguments: -DBUILD_DIR=<the build>, -DWORK=<scratch>,
# -DWITH_SERVER=1 when h2o-server is built (it needs cpp-httplib).
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK}/prefix"
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}): ${err}")
endif()
set(programs h2o-cli h2o-bench h2o-synth h2o-eval h2o-quantize h2o-info h2o-chat)
if(WITH_SERVER)
  list(APPEND programs h2o-server)
endif()
foreach(program ${programs})
  execute_process(COMMAND "${WORK}/prefix/bin/${program}" --version OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^${program} ")
    message(FATAL_ERROR "installed ${program} --version: expected its version, got ${rc}: ${out}${err}")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
message(STATUS "the programs, h2o-chat included, are installed and start")
