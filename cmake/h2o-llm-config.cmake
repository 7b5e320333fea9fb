# CMake package for h2o: after find_package(h2o-llm 0.7 REQUIRED), link h2o::h2o-llm (shared) or
# h2o::h2o-llm-static.
include(CMakeFindDependencyMacro)

# The static library needs threads, sentencepiece, zstd and PCRE2. The last three are found as
# h2o's own build finds them, through pkg-config, under the names the exported targets refer to.
find_dependency(Threads)
find_package(PkgConfig QUIET)
set(h2o_pc_prefixes H2O_SENTENCEPIECE H2O_ZSTD H2O_PCRE2)
set(h2o_pc_modules sentencepiece libzstd libpcre2-8)
foreach(h2o_pc_prefix h2o_pc_module IN ZIP_LISTS h2o_pc_prefixes h2o_pc_modules)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(${h2o_pc_prefix} QUIET IMPORTED_TARGET ${h2o_pc_module})
  endif()
  if(NOT TARGET PkgConfig::${h2o_pc_prefix})
    set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
    string(CONCAT ${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE
        "h2o-llm needs ${h2o_pc_module}, found through pkg-config, and did not find it "
        "(pkg-config: ${PKG_CONFIG_EXECUTABLE}). Install pkg-config and the development files of "
        "sentencepiece, zstd and PCRE2 (Debian/Ubuntu: pkg-config libsentencepiece-dev libzstd-dev libpcre2-dev), or "
        "add the folder holding ${h2o_pc_module}.pc to PKG_CONFIG_PATH.")
    return()
  endif()
endforeach()

# Dependencies of this build's options (the CUDA runtime, with the CUDA backend).
include(${CMAKE_CURRENT_LIST_DIR}/h2o-llm-dependencies.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/h2o-llm-targets.cmake)
