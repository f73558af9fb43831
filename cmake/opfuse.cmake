# Shared build helpers.
#
# LibTorch's headers dominate compile time on two cores, so the sources that include them
# (<torch/...>) reuse one precompiled header built once from cmake/pch.h (the targets share
# flags, which REUSE_FROM requires). Only those: loading the 700 MB header costs a source that
# includes little of LibTorch more than it saves (a kernel took 8 s with it, 3 s without; the
# tune command 21 s against 13 s).
#
# Every target is built with OpenMP (opfuse_openmp, cmake/torch.cmake): LibTorch's parallel
# backend is OpenMP and at::parallel_for is a header template whose `#pragma omp parallel` is
# compiled into the caller, so without -fopenmp it silently runs on one thread (TorchConfig does
# not add it). The flag must also be in the precompiled header, where that template is parsed.
add_library(opfuse_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/pch.cpp)
target_link_libraries(opfuse_pch PUBLIC torch opfuse_openmp)
# Built at the level of the sources that use it (opfuse_glue_level below).
target_compile_options(opfuse_pch PRIVATE $<$<CONFIG:Release>:-O2>)
target_precompile_headers(opfuse_pch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/pch.h)

function(opfuse_target name)
  target_link_libraries(${name} PRIVATE opfuse_openmp)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-psabi)
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                     PRIVATE ${PROJECT_SOURCE_DIR}/src)
  # After the folder's CMakeLists.txt has added all of the target's sources.
  # (DEFER evaluates its arguments when the call runs, so the name is written into the code now.)
  cmake_language(EVAL CODE "cmake_language(DEFER CALL opfuse_precompile_where_heavy [[${name}]])")
  # The shared header is compiled -fPIC; GCC refuses it under -fPIE (-Winvalid-pch), so
  # executables are compiled -fPIC too (they still link as PIE).
  get_target_property(type ${name} TYPE)
  if(type STREQUAL "EXECUTABLE")
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${name} PRIVATE -fPIC)
  endif()
endfunction()

# Whether `file` includes LibTorch's own headers (<torch/...>: the API, autograd, the library,
# TorchScript), itself or through one of the project's headers (quoted includes, looked up beside
# it, in include/ and in src/). ATen's core headers alone are light.
function(opfuse_includes_torch file out)
  get_property(known GLOBAL PROPERTY "opfuse_heavy:${file}" SET)
  if(known)
    get_property(heavy GLOBAL PROPERTY "opfuse_heavy:${file}")
    set(${out} ${heavy} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "opfuse_heavy:${file}" OFF)  # a cycle of includes ends here
  set(heavy OFF)
  file(STRINGS ${file} includes REGEX "^#include [<\"]")
  get_filename_component(dir ${file} DIRECTORY)
  foreach(line ${includes})
    if(line MATCHES "^#include <torch/")
      set(heavy ON)
      break()
    endif()
    if(line MATCHES "^#include \"([^\"]+)\"")
      foreach(base ${dir} ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
        if(EXISTS ${base}/${CMAKE_MATCH_1})
          opfuse_includes_torch(${base}/${CMAKE_MATCH_1} nested)
          if(nested)
            set(heavy ON)
          endif()
          break()
        endif()
      endforeach()
      if(heavy)
        break()
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "opfuse_heavy:${file}" ${heavy})
  set(${out} ${heavy} PARENT_SCOPE)
endfunction()

# The precompiled header for the target's sources that include LibTorch's headers; the others
# are compiled without it, and a target with none of them does not wait for it to be built.
function(opfuse_precompile_where_heavy name)
  get_target_property(sources ${name} SOURCES)
  get_target_property(source_dir ${name} SOURCE_DIR)
  set(light "")
  set(heavy_sources "")
  foreach(source ${sources})
    get_filename_component(path ${source} ABSOLUTE BASE_DIR ${source_dir})
    if(NOT path MATCHES "\\.cpp$")
      continue()
    endif()
    get_source_file_property(skip ${path} SKIP_PRECOMPILE_HEADERS)
    opfuse_includes_torch(${path} heavy)
    if(heavy AND NOT skip)
      list(APPEND heavy_sources ${path})
    else()
      list(APPEND light ${path})
    endif()
  endforeach()
  if(heavy_sources)
    target_precompile_headers(${name} REUSE_FROM opfuse_pch)
    set_source_files_properties(${light} TARGET_DIRECTORY ${name} PROPERTIES SKIP_PRECOMPILE_HEADERS ON
                                SKIP_UNITY_BUILD_INCLUSION ON)
    opfuse_unity_by_folder(${name} "${heavy_sources}")
    opfuse_glue_level(${name} "${light}")
  endif()
endfunction()

# The sources that include LibTorch are glue: an op's schemas, autograd, fake kernel and spec,
# the models, the commands. They call kernels and LibTorch and run no hot loop of their own, so
# they are compiled -O2, as distributions build C++ (an op's unit took 31 s at -O3, 25 s at -O2).
# The light sources, where the loops are (the kernels, the trace reader), keep the build's -O3.
# A folder that lowers the level itself (the tests, -O1) is left alone.
function(opfuse_glue_level name light)
  if(NOT CMAKE_CXX_FLAGS_RELEASE MATCHES "-O3")
    return()
  endif()
  target_compile_options(${name} PRIVATE $<$<CONFIG:Release>:-O2>)
  set_property(SOURCE ${light} TARGET_DIRECTORY ${name} APPEND PROPERTY COMPILE_OPTIONS $<$<CONFIG:Release>:-O3>)
endfunction()

# Loading the precompiled header costs a source 6 s whatever it holds (a one-line file took
# 6.1 s), so a target's heavy sources are compiled together, a unit per folder (an op's folder:
# its front end and spec) of at most OPFUSE_UNITY_BATCH sources, so that editing one file
# recompiles a few. Names at a file's scope must then differ between the files of a folder.
set(OPFUSE_UNITY_BATCH 4 CACHE STRING "Heavy sources compiled together in one unit, at most")

function(opfuse_unity_by_folder name sources)
  set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  foreach(path ${sources})
    get_filename_component(dir ${path} DIRECTORY)
    file(RELATIVE_PATH dir ${PROJECT_SOURCE_DIR} ${dir})
    string(MAKE_C_IDENTIFIER ${dir} folder)
    get_property(count GLOBAL PROPERTY "opfuse_unity:${name}:${folder}")
    if(NOT count)
      set(count 0)
    endif()
    math(EXPR unit "${count} / ${OPFUSE_UNITY_BATCH}")
    math(EXPR count "${count} + 1")
    set_property(GLOBAL PROPERTY "opfuse_unity:${name}:${folder}" ${count})
    set_source_files_properties(${path} TARGET_DIRECTORY ${name} PROPERTIES UNITY_GROUP ${folder}_${unit})
  endforeach()
endfunction()
