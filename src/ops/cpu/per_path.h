// Compiles the loops header named by OPFUSE_LOOPS once per CPU path, each in its own namespace
// with its Lanes (lanes.h): scalar_path, and avx2_path and avx512_path under `#pragma GCC
// target`, so every loop is compiled for the path that runs it; OPFUSE_ON_PATH (paths.h) picks
// one at run time. No include guard: a kernel file defines OPFUSE_LOOPS, includes this inside
// its own namespace, and this undefines OPFUSE_LOOPS.
//
//   #define OPFUSE_LOOPS "ops/rms_norm/rms_norm_loops.h"
//   #include "ops/cpu/per_path.h"

namespace scalar_path {
template <typename T>
using Lanes = Lanes1<at::opmath_type<T>>;
#include OPFUSE_LOOPS
}  // namespace scalar_path

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2_path {
template <typename T>
using Lanes = Lanes8;
#include OPFUSE_LOOPS
}  // namespace avx2_path
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512_path {
template <typename T>
using Lanes = Lanes16;
#include OPFUSE_LOOPS
}  // namespace avx512_path
#pragma GCC pop_options

#undef OPFUSE_LOOPS
