# Run by `cmake --install` once the libraries are in place (cmake/install.cmake). Refreshes the
# dynamic loader's cache, as the `make install` of most Linux libraries does, so that a program
# linked with -lh2o-llm starts without LD_LIBRARY_PATH. It does so only when installing as root,
# without DESTDIR, into a folder the loader finds through its cache (those that `ldconfig -v`
# lists: /usr/local/lib on Debian). A package manager stages into DESTDIR and runs ldconfig itself
# when the package is installed. Anywhere else, programs need an rpath or LD_LIBRARY_PATH.
# Expects H2O_INSTALL_LIBDIR: the library folder, relative to the prefix or absolute.

if(DEFINED ENV{DESTDIR} AND NOT "$ENV{DESTDIR}" STREQUAL "")
  return()
endif()
cmake_path(ABSOLUTE_PATH H2O_INSTALL_LIBDIR BASE_DIRECTORY "${CMAKE_INSTALL_PREFIX}"
  NORMALIZE OUTPUT_VARIABLE h2o_libdir)
find_program(H2O_LDCONFIG ldconfig PATHS /sbin /usr/sbin NO_CACHE)
if(NOT H2O_LDCONFIG)
  return()
endif()

# The folders the loader's cache covers: `ldconfig -v` names each before its libraries, as
# "DIR: (from FILE:LINE)"; -N -X only read. Compared by real path (/lib is /usr/lib on Debian 12).
execute_process(COMMAND "${H2O_LDCONFIG}" -v -N -X OUTPUT_VARIABLE h2o_ldconfig_out
  ERROR_QUIET RESULT_VARIABLE h2o_ldconfig_rc)
if(NOT h2o_ldconfig_rc EQUAL 0)
  return()
endif()
file(REAL_PATH "${h2o_libdir}" h2o_libdir_real)
string(REGEX MATCHALL "(^|\n)/[^:\n]*:" h2o_cached_dirs "${h2o_ldconfig_out}")
set(h2o_in_cache FALSE)
foreach(dir IN LISTS h2o_cached_dirs)
  string(REGEX REPLACE "^\n?(.*):$" "\\1" dir "${dir}")
  file(REAL_PATH "${dir}" dir_real)
  if(dir_real STREQUAL h2o_libdir_real)
    set(h2o_in_cache TRUE)
  endif()
endforeach()
if(NOT h2o_in_cache)
  message(STATUS "${h2o_libdir} is not in the loader's search path: programs linked with "
    "-lh2o-llm need an rpath or LD_LIBRARY_PATH")
  return()
endif()

execute_process(COMMAND id -u OUTPUT_VARIABLE h2o_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT h2o_uid STREQUAL "0")
  message(STATUS "Not root: run ldconfig as root before starting programs linked with -lh2o-llm")
  return()
endif()
message(STATUS "Running ldconfig: ${h2o_libdir} is in the loader's search path")
execute_process(COMMAND "${H2O_LDCONFIG}" RESULT_VARIABLE h2o_ldconfig_rc)
if(NOT h2o_ldconfig_rc EQUAL 0)
  message(FATAL_ERROR "ldconfig failed (exit ${h2o_ldconfig_rc})")
endif()
