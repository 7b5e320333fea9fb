# The Hugging Face tokenizer reader (hf_tokenizer.cpp): a static library that the tools, the tests
# and the fuzz targets link. It needs nlohmann-json, which the library itself does not. Included by
# tools/ and tests/ (whichever comes first defines it), since either may be built without the other;
# each includer finds nlohmann-json itself, since found packages are seen only below where found.
find_package(nlohmann_json 3.10 REQUIRED)
if(NOT TARGET h2o-hf-tokenizer)
  add_library(h2o-hf-tokenizer STATIC ${CMAKE_CURRENT_LIST_DIR}/hf_tokenizer.cpp)
  target_include_directories(h2o-hf-tokenizer PUBLIC ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(h2o-hf-tokenizer PUBLIC h2o-llm-static PRIVATE nlohmann_json::nlohmann_json)
  target_compile_options(h2o-hf-tokenizer PRIVATE ${H2O_WARNINGS})
endif()
