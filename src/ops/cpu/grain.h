// How much work one at::parallel_for task gets, shared by every kernel: at least kGrain elements,
// so a chunk outweighs the cost of waking a thread (~µs) yet a 56×56 plane of one sample still
// splits.
#pragma once

#include <algorithm>
#include <cstdint>

namespace opfuse::cpu {

inline constexpr int64_t kGrain = 32768;

// Tasks (rows, planes, blocks) per chunk when each task holds elements_per_task elements.
inline int64_t grain_for(int64_t elements_per_task) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, elements_per_task));
}

// NCHW planes under this many elements (a late EfficientNet layer's 6×6 or 3×3) are mostly one
// partial vector each, loaded and stored through a buffer: the per-channel ops (batch_norm_silu,
// se_gate) run such x as whole stretches of planes instead.
inline constexpr int64_t kSmallPlane = 64;

// The row-wise norms (rms_norm, add_layer_norm) cut their rows into blocks of about
// kBlockElements elements, one task each.
inline constexpr int64_t kBlockElements = 16384;
inline int64_t rows_per_block(int64_t d) { return std::max<int64_t>(1, kBlockElements / std::max<int64_t>(1, d)); }
// Their weights' gradients are summed per block of at most kDwRows rows in float (each partial
// within 16 roundings), then the blocks in double, in block order: the same bits for any thread
// count. The per-column partials are padded to whole vectors of the widest path.
inline constexpr int64_t kDwRows = 16;
inline int64_t padded_length(int64_t d) { return (d + 15) / 16 * 16; }

}  // namespace opfuse::cpu
