# Cross-compiling h2o for 64-bit ARM Linux with Debian/Ubuntu's GNU cross toolchain
# (package g++-aarch64-linux-gnu). Usage:
#   cmake -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DH2O_ARM64_SYSROOT=/path/to/sysroot
# H2O_ARM64_SYSROOT is a folder holding the ARM64 builds of the libraries h2o links against
# (sentencepiece, zstd, PCRE2) and the doctest and nlohmann-json headers, laid out as Debian's
# packages unpack (usr/include, usr/lib/aarch64-linux-gnu); scripts/ci-arm64.sh prepares one. The
# C library comes from the cross toolchain itself (/usr/aarch64-linux-gnu). Tests and CTest run
# the programs through qemu-aarch64 (package qemu-user).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(H2O_ARM64_SYSROOT "" CACHE PATH "Folder with the ARM64 sentencepiece, zstd, PCRE2, doctest and nlohmann-json (usr/...)")
# CMake reads toolchain files more than once (also for try_compile projects): pass the folder on.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES H2O_ARM64_SYSROOT)
if(NOT H2O_ARM64_SYSROOT OR NOT EXISTS "${H2O_ARM64_SYSROOT}/usr")
  message(FATAL_ERROR "H2O_ARM64_SYSROOT must name a folder holding usr/include and "
                      "usr/lib/aarch64-linux-gnu for ARM64 (scripts/ci-arm64.sh prepares one)")
endif()
set(h2o_arm64_libdir "${H2O_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu")

# Look for libraries, headers and CMake packages only in the ARM64 folders; programs (glslc,
# pkg-config) on the build machine.
set(CMAKE_FIND_ROOT_PATH "${H2O_ARM64_SYSROOT}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config answers with the ARM64 .pc files, their paths prefixed with the folder.
set(ENV{PKG_CONFIG_LIBDIR} "${h2o_arm64_libdir}/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${H2O_ARM64_SYSROOT}")

# libsentencepiece needs libzstd: let the linker find it there when checking for undefined symbols.
string(APPEND CMAKE_EXE_LINKER_FLAGS_INIT " -Wl,-rpath-link,${h2o_arm64_libdir}")
string(APPEND CMAKE_SHARED_LINKER_FLAGS_INIT " -Wl,-rpath-link,${h2o_arm64_libdir}")

# Programs built here (tests, test discovery) run under user-mode emulation. QEMU_CPU in the
# environment picks the emulated CPU model (e.g. max, cortex-a57).
find_program(H2O_QEMU_AARCH64 qemu-aarch64)
if(H2O_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${H2O_QEMU_AARCH64};-L;/usr/aarch64-linux-gnu;-E;LD_LIBRARY_PATH=${h2o_arm64_libdir}")
endif()
