// A parameter group cut into pieces of kPiece elements, whatever tensor they belong to, so that
// threads share out large and small tensors alike: the fused optimizers' parallel loop.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/grain.h"

namespace opfuse::cpu {

// 16384 elements (64 KiB of float p, ~450 KiB across AdamW's p, g, m, v): a piece's arrays stay in
// L2 while it is updated, and a 15M-parameter group gives ~1000 pieces to share out.
inline constexpr int64_t kPiece = 16384;

struct Piece {
  int64_t tensor, begin, n;
};

inline std::vector<Piece> pieces_of(at::TensorList params) {
  std::vector<Piece> pieces;
  for (int64_t i = 0; i < int64_t(params.size()); ++i)
    for (int64_t begin = 0; begin < params[i].numel(); begin += kPiece)
      pieces.push_back({i, begin, std::min(kPiece, params[i].numel() - begin)});
  return pieces;
}

// update(piece) for every piece, in parallel. An optimizer updates each element alone, so any
// split across threads gives the same bits.
template <typename F>
void for_each_piece(const std::vector<Piece>& pieces, const F& update) {
  at::parallel_for(0, int64_t(pieces.size()), grain_for(kPiece), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) update(pieces[i]);
  });
}

}  // namespace opfuse::cpu
