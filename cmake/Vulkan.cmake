# The vulkan device (src/device/vulkan/): built when NM_VULKAN is ON, or
# AUTO and both the Vulkan headers and glslc are found. Its GLSL shaders are
# compiled by glslc at build time and embedded in the library as SPIR-V, so
# the binary needs no file beside it; the loader is opened at run time.
set(NM_VULKAN AUTO CACHE STRING "Build the vulkan device: AUTO, ON or OFF")
set_property(CACHE NM_VULKAN PROPERTY STRINGS AUTO ON OFF)

# Sets NM_HAVE_VULKAN.
function(nm_find_vulkan)
  set(NM_HAVE_VULKAN OFF PARENT_SCOPE)
  if(NM_VULKAN STREQUAL "OFF")
    message(STATUS "vulkan device: off (NM_VULKAN=OFF)")
    return()
  endif()
  find_path(NM_VULKAN_INCLUDE vulkan/vulkan.h)
  find_program(NM_GLSLC glslc)
  if(NOT NM_VULKAN_INCLUDE OR NOT NM_GLSLC)
    if(NM_VULKAN STREQUAL "ON")
      message(FATAL_ERROR "NM_VULKAN=ON needs the Vulkan headers (libvulkan-dev) and glslc; "
                          "headers: ${NM_VULKAN_INCLUDE}, glslc: ${NM_GLSLC}")
    endif()
    message(STATUS "vulkan device: not built (Vulkan headers or glslc not found)")
    return()
  endif()
  message(STATUS "vulkan device: built (glslc ${NM_GLSLC})")
  set(NM_HAVE_VULKAN ON PARENT_SCOPE)
endfunction()

# Adds the shaders and the Vulkan headers to target.
function(nm_add_vulkan target)
  set(dir ${CMAKE_SOURCE_DIR}/src/device/vulkan/shaders)
  set(out ${CMAKE_BINARY_DIR}/shaders)
  set(incs "")
  foreach(name ffn_gate_up ffn_down dense_norm dense_qk dense_attn dense_shexp dense_matmul)
    add_custom_command(
      OUTPUT ${out}/${name}.inc
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
      COMMAND ${NM_GLSLC} --target-env=vulkan1.1 -O -mfmt=c -o ${out}/${name}.inc
              ${dir}/${name}.comp
      DEPENDS ${dir}/${name}.comp ${dir}/weights.glsl ${dir}/dense.glsl
      COMMENT "glslc ${name}.comp")
    list(APPEND incs ${out}/${name}.inc)
  endforeach()
  configure_file(${CMAKE_SOURCE_DIR}/cmake/vk_spirv.c.in ${out}/spirv.c COPYONLY)
  set_source_files_properties(${out}/spirv.c PROPERTIES OBJECT_DEPENDS "${incs}")
  target_sources(${target} PRIVATE ${out}/spirv.c)
  target_include_directories(${target} PRIVATE ${out} ${NM_VULKAN_INCLUDE})
  target_compile_definitions(${target} PUBLIC NM_HAVE_VULKAN=1)
  target_link_libraries(${target} PUBLIC ${CMAKE_DL_LIBS})
endfunction()
