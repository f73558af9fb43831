// The fused optimizers' operands: each parameter's tensors walked as one flat run of memory, which
// any dense layout allows so long as a parameter and its gradient and state share it (a
// channels_last weight and its zeros_like state do). A tensor that does not is taken through a copy
// in the parameter's layout (or a contiguous one when the parameter itself is not dense), and a
// copy of a tensor the step writes is written back by finish().
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace opfuse {

class DenseOperands {
 public:
  // The parameter itself when it is dense, else a contiguous copy written back.
  at::Tensor param(const at::Tensor& p) {
    if (p.is_non_overlapping_and_dense()) return p;
    at::Tensor copy = p.contiguous();
    write_back_.emplace_back(p, copy);
    return copy;
  }

  // t in `layout`'s strides: itself when it has them, else a copy (written back if `written`).
  at::Tensor like(const at::Tensor& t, const at::Tensor& layout, bool written) {
    if (t.strides() == layout.strides() && t.is_non_overlapping_and_dense()) return t;
    at::Tensor copy = at::empty_like(layout);
    copy.copy_(t);
    if (written) write_back_.emplace_back(t, copy);
    return copy;
  }

  void finish() {
    for (auto& [given, updated] : write_back_) given.copy_(updated);
  }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back_;  // (given, updated copy)
};

// "params[3]": a list's entry, for messages.
inline std::string entry(const char* list, size_t i) { return std::string(list) + "[" + std::to_string(i) + "]"; }

}  // namespace opfuse
