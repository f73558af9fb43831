// The opfuse operator library. Each op defines its schemas, kernels, autograd and spec beside its
// code (src/ops/<op>/): adding one edits nothing here.
#include <dlfcn.h>
#include <torch/library.h>

#include "opfuse/ops.h"

TORCH_LIBRARY(opfuse, m) {}

namespace opfuse {

const char* ops_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ops_library_path), &info) == 0) return "";
  return info.dli_fname;
}

}  // namespace opfuse
