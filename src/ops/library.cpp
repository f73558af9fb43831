// The opfuse operator schemas, in one place (as ATen's native_functions.yaml). Kernels and
// autograd are registered beside each operator's code in src/ops/<op>.cpp.
#include <dlfcn.h>
#include <torch/library.h>

#include "opfuse/ops.h"

TORCH_LIBRARY(opfuse, m) {
  m.def("silu(Tensor x) -> Tensor");
  m.def("silu_backward(Tensor grad, Tensor x) -> Tensor");
  m.def("swish(Tensor x, float beta=1.0) -> Tensor");
  m.def("swish_backward(Tensor grad, Tensor x, float beta) -> Tensor");
  m.def("se_gate(Tensor x, Tensor gate) -> Tensor");
  m.def("se_gate_backward(Tensor grad, Tensor x, Tensor gate) -> (Tensor, Tensor)");
}

namespace opfuse {

const char* ops_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ops_library_path), &info) == 0) return "";
  return info.dli_fname;
}

}  // namespace opfuse
