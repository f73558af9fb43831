// Scratch memory for the vector loops: a std::vector whose data starts on a cache line. malloc
// gives 16-byte alignment, so a 64-byte AVX-512 load or store at a whole-vector offset would span
// two lines, and a split store costs about a second one: rms_norm's backward, which reads and
// writes its dw partials once per vector, ran 8–10 % faster with them aligned.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace opfuse::cpu {

inline constexpr std::size_t kCacheLine = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{kCacheLine}); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace opfuse::cpu
