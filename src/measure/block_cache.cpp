// Large tensors kept for reuse while measuring. glibc maps every block above its mmap threshold
// (at most 32 MiB) afresh and unmaps it on free, so a 131 MB logits tensor faults in 32,000 new
// pages each round; in this VM a fault sometimes stalls, and cross_entropy's rounds then varied
// 25× (a clone took 1.2 s against 25 ms for a copy into an existing tensor). Here torch's CPU
// allocator hands such blocks back to a cache instead, and a later request of the same size
// takes one already touched: what a round times is the kernel, as a GPU caching allocator does.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>

#include "block_cache.h"

namespace opfuse::measure {
namespace {

// glibc's largest mmap threshold: smaller blocks already come from the heap (keep_freed_memory).
constexpr size_t kLarge = size_t{32} << 20;

class BlockCache final : public c10::Allocator {
 public:
  explicit BlockCache(c10::Allocator* small) : small_(small) {
    state().small_free = small->raw_deleter();
  }

  c10::DataPtr allocate(size_t bytes) override {
    if (bytes < kLarge) return small_->allocate(bytes);
    void* block = state().take(bytes);
    report(block, static_cast<int64_t>(bytes));
    return {block, block, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  // raw_allocate/raw_deallocate (oneDNN's scratch buffers) free by pointer alone, so one deleter
  // must take a block of either size.
  c10::DeleterFnPtr raw_deleter() const override {
    return small_->raw_deleter() ? &give_back : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  struct State {
    std::mutex mutex;
    std::unordered_multimap<size_t, void*> idle;  // by exact size: a measurement repeats its sizes
    std::unordered_map<void*, size_t> sizes;      // of every block handed out or idle
    size_t idle_bytes = 0, live_bytes = 0, limit = 0;
    c10::DeleterFnPtr small_free = nullptr;  // the wrapped allocator's, for blocks below kLarge

    void* take(size_t bytes) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        live_bytes += bytes;
        auto it = idle.find(bytes);
        if (it != idle.end()) {
          void* block = it->second;
          idle.erase(it);
          idle_bytes -= bytes;
          return block;
        }
      }
      void* block = nullptr;
      if (posix_memalign(&block, c10::gAlignment, bytes) != 0) {
        std::lock_guard<std::mutex> lock(mutex);
        live_bytes -= bytes;
        throw std::bad_alloc();
      }
      std::lock_guard<std::mutex> lock(mutex);
      sizes[block] = bytes;
      return block;
    }

    // The block's size, 0 for one the cache did not hand out; kept for reuse while the cache
    // holds less than its limit.
    size_t put(void* block) {
      std::lock_guard<std::mutex> lock(mutex);
      const auto it = sizes.find(block);
      if (it == sizes.end()) return 0;
      const size_t bytes = it->second;
      live_bytes -= bytes;
      if (idle_bytes + bytes > limit) {
        sizes.erase(it);
        std::free(block);
      } else {
        idle.emplace(bytes, block);
        idle_bytes += bytes;
      }
      return bytes;
    }
  };

  static State& state() {
    static State s;
    return s;
  }

 private:
  // What the default allocator tells a memory profiler (bench-op's peak, torch's profiler).
  static void report(void* block, int64_t bytes) {
    if (!c10::memoryProfilingEnabled()) return;
    c10::reportMemoryUsageToProfiler(block, bytes, static_cast<int64_t>(state().live_bytes),
                                     static_cast<int64_t>(state().live_bytes + state().idle_bytes),
                                     c10::Device(c10::DeviceType::CPU));
  }

  // A block from allocate() or, through raw_deleter, from either allocator.
  static void give_back(void* block) {
    const size_t bytes = state().put(block);
    if (bytes == 0) return state().small_free(block);
    report(block, -static_cast<int64_t>(bytes));
  }

  c10::Allocator* small_;
};

}  // namespace

void keep_large_blocks(size_t limit) {
  static BlockCache* cache = [limit] {
    auto* c = new BlockCache(c10::GetCPUAllocator());  // given to c10, which keeps it
    BlockCache::state().limit = limit;
    c10::SetCPUAllocator(c, /*priority=*/1);
    return c;
  }();
  (void)cache;
}

}  // namespace opfuse::measure
