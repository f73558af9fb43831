# Shared build helpers.
#
# LibTorch's headers dominate compile time on two cores, so every target reuses one
# precompiled header built once from cmake/pch.h (the targets share flags, which
# REUSE_FROM requires).
#
# Every target is built with OpenMP (opfuse_openmp, cmake/torch.cmake): LibTorch's parallel
# backend is OpenMP and at::parallel_for is a header template whose `#pragma omp parallel` is
# compiled into the caller, so without -fopenmp it silently runs on one thread (TorchConfig does
# not add it). The flag must also be in the precompiled header, where that template is parsed.
add_library(opfuse_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/pch.cpp)
target_link_libraries(opfuse_pch PUBLIC torch opfuse_openmp)
target_precompile_headers(opfuse_pch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/pch.h)

function(opfuse_target name)
  target_link_libraries(${name} PRIVATE opfuse_openmp)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-psabi)
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                     PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_precompile_headers(${name} REUSE_FROM opfuse_pch)
  # The shared header is compiled -fPIC; GCC refuses it under -fPIE (-Winvalid-pch), so
  # executables are compiled -fPIC too (they still link as PIE).
  get_target_property(type ${name} TYPE)
  if(type STREQUAL "EXECUTABLE")
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${name} PRIVATE -fPIC)
  endif()
endfunction()
