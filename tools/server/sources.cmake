# The sources of h2o-server's protocol and conversation code (all but main), which the tests and
# the fuzz targets compile too. Needs nlohmann-json; not cpp-httplib.
set(H2O_SERVER_CORE_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/chat_request.cpp ${CMAKE_CURRENT_LIST_DIR}/history_digest.cpp
    ${CMAKE_CURRENT_LIST_DIR}/conversation_file.cpp ${CMAKE_CURRENT_LIST_DIR}/conversation_store.cpp
    ${CMAKE_CURRENT_LIST_DIR}/chat_turn.cpp ${CMAKE_CURRENT_LIST_DIR}/memory_plan.cpp
    ${CMAKE_CURRENT_LIST_DIR}/reuse_policy.cpp ${CMAKE_CURRENT_LIST_DIR}/cache_trace.cpp)
