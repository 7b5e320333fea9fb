# Debian packages (`cpack -G DEB` in the build folder, or `cmake --build BUILD --target package`),
# one per install component (cmake/install.cmake):
#   libh2o-llm<ABI>  the shared library (named after its soname, as Debian names libraries)
#   libh2o-llm-dev   the header, the static library, the CMake package and pkg-config files
#   h2o-tools        the programs
# They install under /usr. Their library dependencies come from dpkg-shlibdeps; the packages'
# dependencies on each other are exact versions. scripts/test-packages.sh installs and checks them.
install(FILES LICENSE THIRD-PARTY-NOTICES.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)

set(CPACK_PACKAGE_NAME h2o-llm)
set(CPACK_PACKAGE_VENDOR "The h2o authors")
set(CPACK_PACKAGE_CONTACT "The h2o authors")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Constant-memory inference of Llama-family language models")
set(CPACK_RESOURCE_FILE_LICENSE ${CMAKE_CURRENT_SOURCE_DIR}/LICENSE)
set(CPACK_OUTPUT_FILE_PREFIX packages)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_COMPONENTS_ALL runtime dev tools)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The programs need libh2o-llm.so.N of this build, which no installed package provides yet:
# dpkg-shlibdeps finds it in the build folder and leaves it to the exact dependency below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_CURRENT_BINARY_DIR})

set(h2o_runtime_package libh2o-llm${H2O_ABI_VERSION})
set(h2o_exact_runtime "${h2o_runtime_package} (= ${PROJECT_VERSION})")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${h2o_runtime_package})
# A shlibs file and the ldconfig trigger, so programs find the library once it is installed.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_GENERATE_SHLIBS_POLICY "=")
# Vulkan is opened at run time (and the CPU is used without it), so the loader is recommended,
# not required.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "libvulkan1")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
  "h2o runs Llama-family language models (GGUF files) in a fixed amount of memory: its KV cache\n"
  "has a fixed number of slots per layer and head and evicts by attention statistics (H2O,\n"
  "Scissorhands, TOVA, StreamingLLM windows), with pinned spans and position rolling, on the CPU,\n"
  "Vulkan or CUDA. This package holds the shared library.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libh2o-llm-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The static library needs what the shared one links (found by the CMake package through
# pkg-config).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${h2o_exact_runtime}, libsentencepiece-dev, libzstd-dev, libpcre2-dev, pkg-config")
set(CPACK_COMPONENT_DEV_DESCRIPTION "h2o's C header, static library, CMake package and pkg-config files.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME h2o-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "${h2o_exact_runtime}")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
  "h2o's programs: h2o-cli (generation), h2o-chat (a chat in constant memory), h2o-info, h2o-bench,\n"
  "h2o-eval (perplexity of eviction policies), h2o-quantize and h2o-synth.")

include(CPack)
