# What `cmake --install` puts in the prefix: the header, libh2o-llm.so (with its SONAME links),
# libh2o-llm-static.a, a CMake package exporting h2o::h2o-llm and h2o::h2o-llm-static, and
# pkg-config files; then it runs ldconfig where that is the convention (cmake/ldconfig.cmake).
# The programs install themselves (tools/CMakeLists.txt).
# scripts/test-install.sh builds and runs programs against the result.
include(CMakePackageConfigHelpers)

# Each file belongs to a component, which is a package of its own (cmake/package.cmake):
# runtime (the shared library), dev (header, static library, CMake and pkg-config files), tools
# (the programs: tools/CMakeLists.txt).
install(FILES include/h2o/h2o.h include/h2o/h2o_experimental.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/h2o COMPONENT dev)
install(TARGETS h2o-llm h2o-llm-static EXPORT h2o-llm-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  # Refreshes the loader's cache when that is the convention (the script says when).
  install(CODE "set(H2O_INSTALL_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
    include(\"${CMAKE_CURRENT_SOURCE_DIR}/cmake/ldconfig.cmake\")" COMPONENT runtime)
endif()

# ---- CMake: find_package(h2o-llm 0.7 REQUIRED) ------------------------------------------------
set(h2o_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/h2o-llm)
install(EXPORT h2o-llm-targets NAMESPACE h2o:: DESTINATION ${h2o_cmake_dir} COMPONENT dev)
# Before 1.0 a minor version may break the API, so 0.7.x accepts only requests for 0.7.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/h2o-llm-config-version.cmake
  COMPATIBILITY SameMinorVersion)
# What this build's static library needs besides: the CUDA runtime when the CUDA backend is in.
if(H2O_CUDA)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/h2o-llm-dependencies.cmake "find_dependency(CUDAToolkit)\n")
else()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/h2o-llm-dependencies.cmake "")
endif()
install(FILES cmake/h2o-llm-config.cmake ${CMAKE_CURRENT_BINARY_DIR}/h2o-llm-config-version.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/h2o-llm-dependencies.cmake DESTINATION ${h2o_cmake_dir} COMPONENT dev)

# ---- pkg-config ------------------------------------------------------------------------------
# Two files, because the static archive is not named like the shared library: -lh2o-llm would
# find libh2o-llm.so, so static linking goes through h2o-llm-static.pc.
# Each file finds the prefix from its own folder (${pcfiledir}), so it stays right when
# `cmake --install --prefix` picks another prefix than the one configured.
file(RELATIVE_PATH H2O_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" H2O_PC_TO_PREFIX "${H2O_PC_TO_PREFIX}")
file(RELATIVE_PATH H2O_PC_LIBDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_LIBDIR})
file(RELATIVE_PATH H2O_PC_INCLUDEDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_INCLUDEDIR})
# The C++ runtime and threads, needed by whoever links the static library.
set(H2O_PC_LIBS_PRIVATE "-lstdc++ -lm -pthread")
if(H2O_VULKAN AND CMAKE_DL_LIBS)
  string(APPEND H2O_PC_LIBS_PRIVATE " -l${CMAKE_DL_LIBS}")
endif()
if(H2O_CUDA)
  # The static CUDA runtime, which opens the driver itself (libdl, librt).
  string(APPEND H2O_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
endif()

function(h2o_pkg_config name cflags)
  set(H2O_PC_NAME ${name})
  set(H2O_PC_CFLAGS "${cflags}")
  configure_file(cmake/h2o-llm.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${name}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${name}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endfunction()
h2o_pkg_config(h2o-llm " -DH2O_USING_SHARED")
h2o_pkg_config(h2o-llm-static "")
