// Which CPU code path the opfuse kernels take.
//
// As ATen's ATEN_CPU_CAPABILITY, OPFUSE_CPU_CAPABILITY=scalar|avx2 overrides the detected
// capability; tests flip it at run time to check both paths against the same reference.
#pragma once

namespace opfuse::cpu {

enum class Capability { scalar, avx2 };

Capability cpu_capability();
void set_cpu_capability(Capability capability);
const char* capability_name(Capability capability);

}  // namespace opfuse::cpu
