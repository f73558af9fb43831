// Choosing the CPU path at run time for a kernel whose loops are compiled once per path: the
// kernel file includes its loops header in namespaces scalar_path, avx2_path and avx512_path,
// each defining `template <typename T> using Lanes = …` (lanes.h), the vector ones under
// `#pragma GCC target`.
#pragma once

#include <type_traits>

#include "ops/cpu/capability.h"

// Runs FN<Lanes> ARGS in the namespace of the CPU path in use; float64 takes the scalar path.
#define OPFUSE_ON_PATH(T, FN, ARGS)                                                        \
  do {                                                                                     \
    if constexpr (!std::is_same_v<T, double>) {                                            \
      if (cpu_capability() == Capability::avx512) {                                        \
        avx512_path::FN<avx512_path::Lanes<T>> ARGS;                                       \
        break;                                                                             \
      }                                                                                    \
      if (cpu_capability() == Capability::avx2) {                                          \
        avx2_path::FN<avx2_path::Lanes<T>> ARGS;                                           \
        break;                                                                             \
      }                                                                                    \
    }                                                                                      \
    scalar_path::FN<scalar_path::Lanes<T>> ARGS;                                           \
  } while (0)
