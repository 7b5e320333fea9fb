# h2o-server's protocol and conversation code (all but main), compiled once as h2o-server-objects
# for every program that links it: h2o-server (through h2o-server-core), h2o-cache-replay, the
# tests and the fuzz targets. Needs nlohmann-json; not cpp-httplib. Included by tools/ and tests/
# (whichever comes first defines it), since either may be built without the other.
set(H2O_SERVER_CORE_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/chat_request.cpp ${CMAKE_CURRENT_LIST_DIR}/history_digest.cpp
    ${CMAKE_CURRENT_LIST_DIR}/conversation_file.cpp ${CMAKE_CURRENT_LIST_DIR}/conversation_store.cpp
    ${CMAKE_CURRENT_LIST_DIR}/chat_turn.cpp ${CMAKE_CURRENT_LIST_DIR}/memory_plan.cpp
    ${CMAKE_CURRENT_LIST_DIR}/reuse_policy.cpp ${CMAKE_CURRENT_LIST_DIR}/cache_trace.cpp)
find_package(nlohmann_json 3.10 REQUIRED)
if(NOT TARGET h2o-server-objects)
  add_library(h2o-server-objects OBJECT ${H2O_SERVER_CORE_SOURCES})
  # The public header, and lib/util for the cache policy (cache_policy.h) the server shares with
  # the library; the objects link against either the shared or the static library.
  target_include_directories(h2o-server-objects PUBLIC ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/../../include
                                                       ${CMAKE_CURRENT_LIST_DIR}/../../lib/util)
  target_link_libraries(h2o-server-objects PUBLIC nlohmann_json::nlohmann_json)
  target_compile_options(h2o-server-objects PRIVATE ${H2O_WARNINGS})
endif()
