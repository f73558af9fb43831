// Where `opfuse train` gets its batches: synthetic noise (no data set needed, for timing) or an
// image folder decoded in background threads (for a real, if small, training run).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace opfuse::data {

// ImageNet statistics, per RGB channel, that every image is normalized with.
inline constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};

struct Batch {
  at::Tensor images;  // float32 [B, 3, S, S], (pixel/255 − mean) / std per channel
  at::Tensor labels;  // int64 [B], class indices 0..K−1
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;
  virtual int64_t num_classes() const = 0;
  // One line for people, e.g. "synthetic 3x224x224, 1000 classes".
  virtual std::string describe() const = 0;
};

// Standard-normal images (what normalized photos roughly look like) and uniform labels; the same
// seed gives the same sequence of batches.
std::unique_ptr<BatchSource> synthetic_source(int64_t batch_size, int64_t image_size, int64_t num_classes,
                                              uint64_t seed);

// DIR holds one subfolder per class (sorted names are class indices 0..K−1) with *.jpg, *.jpeg and
// *.png images inside (any case). Each image is decoded to RGB, its shorter side resized to
// image_size (bilinear) and the centre cropped to image_size × image_size, then normalized.
// The order is shuffled per epoch from the seed and cycles forever; `decode_threads` background
// threads decode a few batches ahead. Throws std::invalid_argument for a bad folder or size, and
// std::runtime_error from next() for an image that cannot be decoded.
std::unique_ptr<BatchSource> image_folder_source(const std::string& dir, int64_t batch_size, int64_t image_size,
                                                 uint64_t seed, int decode_threads = 2);

}  // namespace opfuse::data
