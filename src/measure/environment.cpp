// What measured figures depend on: which BLAS serves torch's matmuls, threads, the CPU path.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <climits>
#include <cstdlib>
#include <thread>

#include "opfuse/measure.h"
#include "opfuse/ops.h"

namespace opfuse::measure {
namespace {

// The shared object that serves sgemm_ to torch (the first in the global lookup order), with
// symbolic links resolved: Debian's libblas.so.3 is an alternative pointing at one of several.
std::string blas_path() {
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info{};
  if (sgemm == nullptr || dladdr(sgemm, &info) == 0 || info.dli_fname == nullptr) return "";
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
}

// Debian installs netlib's reference BLAS as …/blas/libblas.so.3 (OpenBLAS, BLIS and ATLAS
// under their own folders).
bool is_reference(const std::string& path) { return path.find("/blas/libblas") != std::string::npos; }

std::string describe_blas(const std::string& path) {
  if (path.empty()) return "unknown (no sgemm_ found)";
  using Config = const char* (*)();
  if (auto config = reinterpret_cast<Config>(dlsym(RTLD_DEFAULT, "openblas_get_config")))
    if (path.find("openblas") != std::string::npos) return fmt::format("{} ({})", config(), path);
  if (is_reference(path)) return fmt::format("reference BLAS, netlib ({})", path);
  // pip's torch links MKL into libtorch_cpu and exports its entry points.
  using MklVersion = void (*)(char*, int);
  if (auto version = reinterpret_cast<MklVersion>(dlsym(RTLD_DEFAULT, "MKL_Get_Version_String"))) {
    char text[256] = {};
    version(text, sizeof text - 1);
    return fmt::format("{} ({})", text, path);
  }
  return path;
}

}  // namespace

Environment environment(int processes) {
  Environment e;
  e.threads = at::get_num_threads();
  e.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  e.cpu_capability = cpu_kernel_path();
  e.torch = TORCH_VERSION;
  const std::string path = blas_path();
  e.blas = describe_blas(path);
  e.reference_blas = is_reference(path);
  if (e.reference_blas)
    e.warnings.push_back(
        "torch's matmuls run on the reference BLAS, about 40x slower than OpenBLAS: every figure with a "
        "linear layer or convolution is off by an order of magnitude; install libopenblas0-openmp "
        "(scripts/setup.sh does) or select it with update-alternatives --config libblas.so.3-x86_64-linux-gnu");
  const std::string ranks = processes > 1 ? fmt::format(" in each of {} ranks", processes) : "";
  if (e.threads * processes < e.cores)
    e.warnings.push_back(fmt::format("{} intra-op thread{}{} on {} cores (--threads, torch.set_num_threads): figures "
                                     "are for that many",
                                     e.threads, e.threads == 1 ? "" : "s", ranks, e.cores));
  return e;
}

}  // namespace opfuse::measure
