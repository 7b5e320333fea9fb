# The Vulkan compute backend, included from the top-level CMakeLists.txt after the library
# targets exist. Needs the Vulkan headers and glslc at build time only: the loader is opened with
# dlopen at run time, and the shaders are compiled to SPIR-V here and embedded in the library.

find_path(H2O_VULKAN_INCLUDE_DIR vulkan/vulkan_core.h DOC "Directory holding vulkan/vulkan_core.h")
find_program(H2O_GLSLC glslc DOC "The glslc GLSL to SPIR-V compiler (shaderc)")
if(H2O_VULKAN_INCLUDE_DIR AND H2O_GLSLC AND EXISTS "${H2O_GLSLC}")
  set(h2o_vulkan_default ON)
else()
  set(h2o_vulkan_default OFF)
  message(STATUS "h2o: Vulkan backend disabled: needs the Vulkan headers (libvulkan-dev) and glslc "
                 "(headers: ${H2O_VULKAN_INCLUDE_DIR}, glslc: ${H2O_GLSLC})")
endif()
option(H2O_VULKAN "Build the Vulkan compute backend (needs the Vulkan headers and glslc)" ${h2o_vulkan_default})

if(NOT H2O_VULKAN AND h2o_vulkan_default)
  message(STATUS "h2o: Vulkan backend disabled (H2O_VULKAN=OFF)")
endif()

if(H2O_VULKAN)
  if(NOT h2o_vulkan_default)
    message(FATAL_ERROR "H2O_VULKAN is ON but the Vulkan headers or glslc were not found "
                        "(headers: ${H2O_VULKAN_INCLUDE_DIR}, glslc: ${H2O_GLSLC})")
  endif()
  message(STATUS "h2o: Vulkan backend enabled (glslc: ${H2O_GLSLC})")

  set(h2o_vk_dir ${CMAKE_CURRENT_SOURCE_DIR}/backends/vulkan)
  set(h2o_vk_shader_dir ${h2o_vk_dir}/shaders)
  set(h2o_vk_out ${CMAKE_CURRENT_BINARY_DIR}/vulkan_shaders)
  file(MAKE_DIRECTORY ${h2o_vk_out})
  file(GLOB h2o_vk_includes CONFIGURE_DEPENDS ${h2o_vk_shader_dir}/*.glsl ${h2o_vk_shader_dir}/*.h)

  set(h2o_vk_names "")
  set(h2o_vk_spv "")
  # h2o_vk_shader(<variant name> <source> <target env> [glslc flags...])
  function(h2o_vk_shader name source env)
    set(spv ${h2o_vk_out}/${name}.spv)
    add_custom_command(
      OUTPUT ${spv}
      COMMAND ${H2O_GLSLC} -fshader-stage=compute --target-env=${env} -O -Werror -I ${CMAKE_CURRENT_SOURCE_DIR}/lib/kv ${ARGN}
              ${h2o_vk_shader_dir}/${source} -o ${spv}
      DEPENDS ${h2o_vk_shader_dir}/${source} ${h2o_vk_includes} ${CMAKE_CURRENT_SOURCE_DIR}/lib/kv/kv_policy_spec.h
              ${CMAKE_CURRENT_SOURCE_DIR}/lib/kv/kv_victim_rules.h
      COMMENT "glslc ${source} -> ${name}.spv"
      VERBATIM)
    set(h2o_vk_names ${h2o_vk_names} ${name} PARENT_SCOPE)
    set(h2o_vk_spv ${h2o_vk_spv} ${spv} PARENT_SCOPE)
  endfunction()

  # Kernels with workgroup reductions come twice: with subgroup arithmetic (Vulkan 1.1) and with
  # shared memory only (_shared), chosen at run time by what the device supports.
  foreach(type f32 f16 q8_0 q4_0 q4_k q5_k q6_k)
    string(TOUPPER ${type} TYPE)
    h2o_vk_shader(get_rows_${type} get_rows.comp vulkan1.0 -DTYPE_${TYPE})
    h2o_vk_shader(matmul_${type} matmul.comp vulkan1.0 -DTYPE_${TYPE})
    h2o_vk_shader(matvec_${type} matvec.comp vulkan1.1 -DTYPE_${TYPE} -DUSE_SUBGROUPS)
    h2o_vk_shader(matvec_${type}_shared matvec.comp vulkan1.0 -DTYPE_${TYPE})
    # Whole rows per subgroup: on CPU devices until a GPU has run the parity suite on it.
    h2o_vk_shader(matvec_rows_${type} matvec.comp vulkan1.1 -DTYPE_${TYPE} -DUSE_SUBGROUPS -DSUBGROUP_ROWS)
  endforeach()
  h2o_vk_shader(rms_norm rms_norm.comp vulkan1.1 -DUSE_SUBGROUPS)
  h2o_vk_shader(rms_norm_shared rms_norm.comp vulkan1.0)
  h2o_vk_shader(argmax argmax.comp vulkan1.1 -DUSE_SUBGROUPS)
  h2o_vk_shader(argmax_shared argmax.comp vulkan1.0)
  h2o_vk_shader(attention attention.comp vulkan1.1 -DUSE_SUBGROUPS)
  h2o_vk_shader(attention_shared attention.comp vulkan1.0)
  h2o_vk_shader(attention_stats attention_stats.comp vulkan1.0)
  h2o_vk_shader(kv_claim kv_claim.comp vulkan1.0)
  h2o_vk_shader(kv_expect kv_expect.comp vulkan1.0)
  h2o_vk_shader(kv_rebalance kv_rebalance.comp vulkan1.0)
  foreach(step gather scatter clear)
    string(TOUPPER ${step} STEP)
    h2o_vk_shader(kv_rebalance_${step} kv_rebalance.comp vulkan1.0 -DSTEP_${STEP})
  endforeach()
  h2o_vk_shader(rope rope.comp vulkan1.0)
  h2o_vk_shader(add elementwise.comp vulkan1.0 -DOP_ADD)
  h2o_vk_shader(add_bias elementwise.comp vulkan1.0 -DOP_ADD_BIAS)
  h2o_vk_shader(swiglu elementwise.comp vulkan1.0 -DOP_SWIGLU)
  h2o_vk_shader(geglu elementwise.comp vulkan1.0 -DOP_GEGLU)
  h2o_vk_shader(scale elementwise.comp vulkan1.0 -DOP_SCALE)
  h2o_vk_shader(softcap elementwise.comp vulkan1.0 -DOP_SOFTCAP)

  string(REPLACE ";" "," h2o_vk_name_list "${h2o_vk_names}")
  set(h2o_vk_embedded ${h2o_vk_out}/vulkan_shaders.cpp)
  add_custom_command(
    OUTPUT ${h2o_vk_embedded}
    COMMAND ${CMAKE_COMMAND} -DSPV_DIR=${h2o_vk_out} -DNAMES=${h2o_vk_name_list} -DOUTPUT=${h2o_vk_embedded}
            -P ${h2o_vk_dir}/embed_spirv.cmake
    DEPENDS ${h2o_vk_spv} ${h2o_vk_dir}/embed_spirv.cmake
    COMMENT "Embedding the SPIR-V shaders"
    VERBATIM)

  file(GLOB h2o_vk_sources CONFIGURE_DEPENDS ${h2o_vk_dir}/*.cpp)
  target_sources(h2o-backends PRIVATE ${h2o_vk_sources} ${h2o_vk_embedded})
  target_include_directories(h2o-backends PRIVATE ${H2O_VULKAN_INCLUDE_DIR})
  target_compile_definitions(h2o-backends PRIVATE H2O_HAVE_VULKAN)
  # Tests (through the static library) compile their Vulkan parts only when it is built; the
  # installed library's users do not need to know.
  target_compile_definitions(h2o-llm-static PUBLIC $<BUILD_INTERFACE:H2O_HAVE_VULKAN>)
  # dlopen lives in libdl on older C libraries.
  target_link_libraries(h2o-llm PRIVATE ${CMAKE_DL_LIBS})
  target_link_libraries(h2o-llm-static PUBLIC ${CMAKE_DL_LIBS})
endif()
