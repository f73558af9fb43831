// Which CPU code path the opfuse kernels take.
//
// As ATen's ATEN_CPU_CAPABILITY, OPFUSE_CPU_CAPABILITY=scalar|avx2|avx512 caps the detected
// capability; tests flip it at run time to check every path against the same reference.
// The avx512 path runs the elementwise ops 16 lanes wide with the same operations in the same
// order as avx2, so the two give identical bits; other kernels use their avx2 loops under it.
#pragma once

namespace opfuse::cpu {

enum class Capability { scalar, avx2, avx512 };

Capability cpu_capability();
// Clamped to what this CPU supports.
void set_cpu_capability(Capability capability);
Capability best_cpu_capability();
const char* capability_name(Capability capability);

}  // namespace opfuse::cpu
