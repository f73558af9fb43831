// Choosing the CPU path at run time for a kernel whose loops per_path.h compiled once per path
// (namespaces scalar_path, avx2_path, avx512_path, each with its Lanes).
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
