// The memory layouts the 4-D kernels (se_gate, batch_norm_silu, drop_connect_add) walk: NCHW, or
// channels_last. Shared by their front ends, which pick the layout, and their kernels, which walk it.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse {

// x is dense in channels_last and not also NCHW-contiguous (one channel, or 1×1 planes, is both:
// NCHW is then taken).
inline bool is_channels_last(const at::Tensor& x) {
  return x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// The layout a kernel gets x in: channels_last when x is, else NCHW (any other layout is copied
// to NCHW once).
inline at::MemoryFormat kernel_layout(const at::Tensor& x) {
  return is_channels_last(x) ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

}  // namespace opfuse
