#include "ops/cpu/capability.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace opfuse::cpu {
namespace {

Capability clamp(Capability wanted) { return std::min(wanted, best_cpu_capability()); }

Capability detect() {
  const char* forced = std::getenv("OPFUSE_CPU_CAPABILITY");
  if (forced == nullptr) return best_cpu_capability();
  if (std::strcmp(forced, "scalar") == 0) return Capability::scalar;
  if (std::strcmp(forced, "avx2") == 0) return clamp(Capability::avx2);
  return best_cpu_capability();
}

std::atomic<Capability>& current() {
  static std::atomic<Capability> capability{detect()};
  return capability;
}

}  // namespace

Capability best_cpu_capability() {
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return Capability::scalar;
  return __builtin_cpu_supports("avx512f") ? Capability::avx512 : Capability::avx2;
}

Capability cpu_capability() { return current().load(std::memory_order_relaxed); }

void set_cpu_capability(Capability capability) {
  current().store(clamp(capability), std::memory_order_relaxed);
}

const char* capability_name(Capability capability) {
  switch (capability) {
    case Capability::avx512: return "avx512";
    case Capability::avx2: return "avx2";
    case Capability::scalar: break;
  }
  return "scalar";
}

}  // namespace opfuse::cpu

namespace opfuse {

const char* cpu_kernel_path() { return cpu::capability_name(cpu::cpu_capability()); }

}  // namespace opfuse
