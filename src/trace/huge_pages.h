// Large arrays that are filled once, right after they are allocated: backing them with huge
// pages turns some ten thousand page faults (most of a 40 MB array's first write here) into
// a few dozen. Where the kernel gives no huge pages this only reserves.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <vector>

namespace opfuse::trace::detail {

template <class T>
void reserve_huge(std::vector<T>& v, size_t n) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  v.reserve(n);
  const auto begin = reinterpret_cast<uintptr_t>(v.data()), end = begin + n * sizeof(T);
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = end & ~(kHuge - 1);
  if (v.empty() && last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

}  // namespace opfuse::trace::detail
