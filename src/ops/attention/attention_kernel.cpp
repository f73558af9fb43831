// Fused attention: o = softmax(scale · q kᵀ + mask) · v, tiled so that no [T, S] matrix is ever
// stored (per thread: a few tile × tile blocks and one head's dq). The loops live in
// cpu/attention_loops.h; this file lays out the heads and spreads them over threads.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention/attention_kernel.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/capability.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"

// GCC 12 reports the AVX-512 intrinsics' own deliberately undefined registers (_mm512_undefined_*)
// as "may be used uninitialized" once they are inlined into these loops.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace opfuse::cpu {
namespace {

// Query rows per block and keys per tile. A 64 × 64 float tile is 16 KiB, so a block's scores,
// probabilities and gradients stay in L2 between the products; from T = 512 on, 128 × 128 tiles
// make the products efficient enough to outweigh the larger triangle computed on the diagonal
// (bench-op attention: ×2.42 vs ×2.24 the composite at T = 256, ×2.68 vs ×2.46 at T = 1024).
int64_t tile_for(int64_t T) { return T >= 512 ? 128 : 64; }

struct Problem {
  int64_t T, S, D, Dv;
  int64_t tile;  // query rows per block, keys per tile
  bool causal;
  double scale;
  bool dropout;
  uint64_t seed;
  uint32_t threshold;  // a key is kept when its 32-bit hash is ≥ p · 2³²
  double keep_scale;   // 1 / (1 − p), 0 when p = 1
};

Problem problem_of(const at::Tensor& q, const at::Tensor& v, int64_t S, const AttentionOptions& o) {
  Problem p{q.size(2), S, q.size(3), v.size(3), tile_for(q.size(2)), o.causal, o.scale, o.dropout_p > 0, o.seed, 0, 1};
  if (p.dropout) {
    p.threshold = uint32_t(std::min(4294967295.0, std::round(o.dropout_p * 4294967296.0)));
    p.keep_scale = o.dropout_p >= 1 ? 0 : 1 / (1 - o.dropout_p);
  }
  return p;
}

uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint32_t mix32(uint32_t h) {  // murmur3's finaliser
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

// One head's mask, a [T, S] view (strides may be 0): a boolean mask (true takes part) or an
// additive one in the accumulation type.
template <typename A>
struct MaskView {
  const bool* keep = nullptr;
  const A* add = nullptr;
  int64_t st = 0, ss = 0;

  // bias[j] for keys j0 … j0 + n − 1 of query row i; false when there is no mask.
  bool row_bias(int64_t i, int64_t j0, int64_t n, A* bias) const {
    if (keep) {
      const bool* r = keep + i * st + j0 * ss;
      for (int64_t j = 0; j < n; ++j) bias[j] = r[j * ss] ? A(0) : -std::numeric_limits<A>::infinity();
      return true;
    }
    if (add) {
      const A* r = add + i * st + j0 * ss;
      for (int64_t j = 0; j < n; ++j) bias[j] = r[j * ss];
      return true;
    }
    return false;
  }
};

// One (batch, head): q [T, D], k [S, D], v [S, Dv], each row-major with its leading dimension.
template <typename A>
struct Head {
  const A *q, *k, *v;
  int64_t ldq, ldk, ldv;
  MaskView<A> mask;
};

// The backward's per-head inputs: do and o [T, Dv] and the rows' (max, sum) [T, 2].
template <typename A>
struct Grad {
  const A *dout, *out;
  int64_t ld_dout, ld_out;
  const A* stats;
};

// A thread's working memory, carved from one tensor allocated on the calling thread (so torch's
// allocator, and a memory profiler, see it); the backward's also holds one head's dq and the
// row terms Σ do·o.
template <typename A>
struct Scratch {
  at::Tensor memory;
  A *s, *dp, *pz, *z, *bias, *o, *m, *l, *delta, *dq, *dk, *dv;
  Scratch(const Problem& p, bool backward) {
    const int64_t b = p.tile, tile = b * b;
    const std::vector<int64_t> sizes{tile, backward ? tile : 0, backward ? tile : 0, tile, b, b * p.Dv, b,
                                     b, backward ? p.T : 0, backward ? p.T * p.D : 0, backward ? b * p.D : 0,
                                     backward ? b * p.Dv : 0};
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    memory = at::empty({total}, at::TensorOptions().dtype(c10::CppTypeToScalarType<A>::value));
    A* next = memory.data_ptr<A>();
    for (auto [field, n] : {std::pair{&s, sizes[0]}, {&dp, sizes[1]}, {&pz, sizes[2]}, {&z, sizes[3]}, {&bias, sizes[4]},
                            {&o, sizes[5]}, {&m, sizes[6]}, {&l, sizes[7]}, {&delta, sizes[8]}, {&dq, sizes[9]},
                            {&dk, sizes[10]}, {&dv, sizes[11]}})
      *field = next, next += n;
  }
};

// One Scratch per thread that parallel_for may run on, indexed by at::get_thread_num().
template <typename A>
std::vector<Scratch<A>> scratch_per_thread(const Problem& p, bool backward) {
  std::vector<Scratch<A>> scratch;
  for (int t = 0; t < at::get_num_threads(); ++t) scratch.emplace_back(p, backward);
  return scratch;
}

#define OPFUSE_LOOPS "ops/attention/attention_loops.h"
#include "ops/cpu/per_path.h"

// t as A, unit stride in its last dimension (what BLAS takes); other strides are kept.
at::Tensor rows_of(const at::Tensor& t, at::ScalarType a) {
  if (t.scalar_type() == a && t.stride(-1) == 1) return t;
  return t.to(a).contiguous();
}

// The heads of q, k, v [B, H, *, *] and of the mask (undefined, or [B, H, T, S] of bool or A).
template <typename A>
std::vector<Head<A>> heads_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const int64_t B = q.size(0), H = q.size(1);
  std::vector<Head<A>> heads;
  heads.reserve(B * H);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      auto at_head = [&](const at::Tensor& t) { return t.data_ptr<A>() + b * t.stride(0) + h * t.stride(1); };
      Head<A> head{at_head(q), at_head(k), at_head(v), q.stride(2), k.stride(2), v.stride(2), {}};
      if (mask.defined()) {
        const int64_t offset = b * mask.stride(0) + h * mask.stride(1);
        if (mask.scalar_type() == at::kBool)
          head.mask.keep = mask.data_ptr<bool>() + offset;
        else
          head.mask.add = mask.data_ptr<A>() + offset;
        head.mask.st = mask.stride(2), head.mask.ss = mask.stride(3);
      }
      heads.push_back(head);
    }
  return heads;
}

template <typename T>
void forward_impl(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& mask,
                  const AttentionOptions& options, at::Tensor& out, at::Tensor& stats) {
  using A = at::opmath_type<T>;
  const auto a = c10::CppTypeToScalarType<A>::value;
  const at::Tensor q = rows_of(q_in, a), k = rows_of(k_in, a), v = rows_of(v_in, a);
  const Problem p = problem_of(q, v, k.size(2), options);
  const std::vector<Head<A>> heads = heads_of<A>(q, k, v, mask);
  const int64_t blocks = (p.T + p.tile - 1) / p.tile;
  T* op = out.data_ptr<T>();
  A* sp = stats.data_ptr<A>();
  // One task per (head, query block): blocks are independent, so even one head fills every thread.
  std::vector<Scratch<A>> scratch = scratch_per_thread<A>(p, false);
  at::parallel_for(0, int64_t(heads.size()) * blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch<A>& w = scratch[at::get_thread_num()];
    const OneBlasThread one_blas_thread;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / blocks, i0 = (t % blocks) * p.tile, rows = std::min(p.tile, p.T - i0);
      OPFUSE_ON_PATH(T, forward_block,
                     (heads[bh], p, bh, i0, rows, w, op + bh * p.T * p.Dv, p.Dv, sp + 2 * bh * p.T));
    }
  });
}

template <typename T>
void backward_impl(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                   const at::Tensor& out_in, const at::Tensor& stats, const at::Tensor& mask,
                   const AttentionOptions& options, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                   at::Tensor& dscores) {
  using A = at::opmath_type<T>;
  const auto a = c10::CppTypeToScalarType<A>::value;
  const at::Tensor q = rows_of(q_in, a), k = rows_of(k_in, a), v = rows_of(v_in, a);
  const at::Tensor dout = rows_of(dout_in, a), out = rows_of(out_in, a);
  const Problem p = problem_of(q, v, k.size(2), options);
  const std::vector<Head<A>> heads = heads_of<A>(q, k, v, mask);
  const A* sp = stats.data_ptr<A>();
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
  A* dsp = dscores.defined() ? dscores.data_ptr<A>() : nullptr;
  const int64_t H = q.size(1);
  // One task per head: its key tiles all add into the head's dq.
  std::vector<Scratch<A>> scratch = scratch_per_thread<A>(p, true);
  at::parallel_for(0, int64_t(heads.size()), 1, [&](int64_t begin, int64_t end) {
    Scratch<A>& w = scratch[at::get_thread_num()];
    const OneBlasThread one_blas_thread;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const Grad<A> g{dout.data_ptr<A>() + b * dout.stride(0) + h * dout.stride(1),
                      out.data_ptr<A>() + b * out.stride(0) + h * out.stride(1), dout.stride(2), out.stride(2),
                      sp + 2 * bh * p.T};
      OPFUSE_ON_PATH(T, backward_head,
                     (heads[bh], g, p, bh, w, dqp + bh * p.T * p.D, dkp + bh * p.S * p.D, dvp + bh * p.S * p.Dv,
                      dsp ? dsp + bh * p.T * p.S : nullptr));
    }
  });
}

}  // namespace

void attention_forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                              const AttentionOptions& options, at::Tensor& out, at::Tensor& stats) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "opfuse::attention",
                                 [&] { forward_impl<scalar_t>(q, k, v, mask, options, out, stats); });
}

void attention_backward_kernel(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& out, const at::Tensor& stats, const at::Tensor& mask,
                               const AttentionOptions& options, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                               at::Tensor& dscores) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "opfuse::attention_backward", [&] {
    backward_impl<scalar_t>(dout, q, k, v, out, stats, mask, options, dq, dk, dv, dscores);
  });
}

}  // namespace opfuse::cpu
