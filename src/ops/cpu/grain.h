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

}  // namespace opfuse::cpu
