# Finds the torch of one Python interpreter and builds against its LibTorch, so the C++ core, the
# opfuse binary and the Python package all load the same libraries the interpreter does.
if(NOT Python3_EXECUTABLE AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(Python3_EXECUTABLE ${PROJECT_SOURCE_DIR}/.venv/bin/python)
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module REQUIRED)
# torch's own description of itself, as torch.utils.cpp_extension builds a CPU extension with it:
# its folder, version, headers and C++ ABI. TorchConfig.cmake is not used: a CUDA wheel's config
# insists on a CUDA toolkit and a GPU even for CPU-only code. Only header folders that exist: torch
# 2.4's list still names include/TH and include/THC, which its wheel no longer ships.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c "import os, torch; from torch.utils import cpp_extension as e; print(os.path.dirname(torch.__file__)); print(torch.__version__.split('+')[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(';'.join(p for p in e.include_paths() if os.path.isdir(p)))"
  OUTPUT_VARIABLE opfuse_torch_query OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE opfuse_torch_found
  ERROR_VARIABLE opfuse_torch_error)
if(NOT opfuse_torch_found EQUAL 0)
  message(FATAL_ERROR "${Python3_EXECUTABLE} has no torch (${opfuse_torch_error}): run scripts/setup.sh "
                      "(the project's .venv) or pass -DPython3_EXECUTABLE=<a python with torch >= 2.4>")
endif()
string(REPLACE "\n" ";" opfuse_torch_query "${opfuse_torch_query}")
list(POP_FRONT opfuse_torch_query TORCH_INSTALL_PREFIX OPFUSE_TORCH_VERSION opfuse_torch_abi)
if(OPFUSE_TORCH_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR "torch ${OPFUSE_TORCH_VERSION} at ${Python3_EXECUTABLE}: opfuse needs torch >= 2.4")
endif()
# opfuse's libraries pass std::string between code that sees torch's headers and code that links
# Debian's yaml-cpp and GoogleTest, which are built with the C++11 ABI: a torch built with the old
# one (pip's wheels before 2.7) would split the build in two ABIs that cannot link.
if(NOT opfuse_torch_abi EQUAL 1)
  message(FATAL_ERROR "torch ${OPFUSE_TORCH_VERSION} at ${Python3_EXECUTABLE} was built with the pre-C++11 "
                      "std::string ABI (pip's wheels before torch 2.7): opfuse needs a torch built with the "
                      "C++11 ABI, as pip's torch >= 2.7 is")
endif()
message(STATUS "opfuse: torch ${OPFUSE_TORCH_VERSION} from ${Python3_EXECUTABLE}")

add_library(torch INTERFACE IMPORTED)
foreach(lib c10 torch_cpu torch)
  find_library(OPFUSE_LIB_${lib} ${lib} PATHS ${TORCH_INSTALL_PREFIX}/lib NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(torch INTERFACE ${OPFUSE_LIB_${lib}})
endforeach()
target_include_directories(torch SYSTEM INTERFACE ${opfuse_torch_query})
# torch's headers carry their own fmt (torch/include/fmt, newer than Debian's libfmt): code that
# sees them uses that fmt header-only, so no object calls into a libfmt of another version.
target_compile_definitions(torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${opfuse_torch_abi} FMT_HEADER_ONLY)
# Binaries find torch's libraries where pip put them, as the interpreter does.
set(CMAKE_BUILD_RPATH ${TORCH_INSTALL_PREFIX}/lib)
set(CMAKE_INSTALL_RPATH ${TORCH_INSTALL_PREFIX}/lib)

# One OpenMP runtime: pip's torch ships its own libgomp.so.1 beside libtorch_cpu. opfuse's objects
# are compiled with -fopenmp (at::parallel_for's `#pragma omp parallel` is in a header and is
# compiled into the caller) but link that libgomp, never the compiler's: two runtimes in one
# process each start a thread pool and oversubscribe the cores.
find_library(OPFUSE_TORCH_GOMP NAMES libgomp.so.1 gomp PATHS ${TORCH_INSTALL_PREFIX}/lib NO_DEFAULT_PATH)
add_library(opfuse_openmp INTERFACE)
target_compile_options(opfuse_openmp INTERFACE -fopenmp)
if(OPFUSE_TORCH_GOMP)
  target_link_libraries(opfuse_openmp INTERFACE ${OPFUSE_TORCH_GOMP})
else()
  # A torch built against the system's OpenMP (e.g. a distribution's) shares the compiler's runtime.
  find_package(OpenMP REQUIRED)
  target_link_libraries(opfuse_openmp INTERFACE OpenMP::OpenMP_CXX)
endif()
