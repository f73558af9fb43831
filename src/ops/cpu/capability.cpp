#include "ops/cpu/capability.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace opfuse::cpu {
namespace {

Capability detect() {
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* forced = std::getenv("OPFUSE_CPU_CAPABILITY");
  if (forced != nullptr && std::strcmp(forced, "scalar") == 0) return Capability::scalar;
  return has_avx2 ? Capability::avx2 : Capability::scalar;
}

std::atomic<Capability>& current() {
  static std::atomic<Capability> capability{detect()};
  return capability;
}

}  // namespace

Capability cpu_capability() { return current().load(std::memory_order_relaxed); }

void set_cpu_capability(Capability capability) {
  // Never promise AVX2 to a CPU that lacks it.
  if (capability == Capability::avx2 &&
      !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    capability = Capability::scalar;
  }
  current().store(capability, std::memory_order_relaxed);
}

const char* capability_name(Capability capability) {
  return capability == Capability::avx2 ? "avx2" : "scalar";
}

}  // namespace opfuse::cpu
