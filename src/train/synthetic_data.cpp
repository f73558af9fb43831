// synthetic_source: random ImageNet-shaped batches, for timing a training step without a data set.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <stdexcept>

#include "opfuse/data.h"

namespace opfuse::data {
namespace {

class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(int64_t batch_size, int64_t image_size, int64_t num_classes, uint64_t seed)
      : batch_size_(batch_size),
        image_size_(image_size),
        num_classes_(num_classes),
        generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  // One generator owned by the source draws images then labels, so the sequence depends on the
  // seed alone, not on what other code draws from the global generator.
  Batch next() override {
    Batch b;
    b.images = at::randn({batch_size_, 3, image_size_, image_size_}, generator_, at::kFloat);
    b.labels = at::randint(0, num_classes_, {batch_size_}, generator_, at::kLong);
    return b;
  }

  int64_t num_classes() const override { return num_classes_; }

  std::string describe() const override {
    return fmt::format("synthetic 3x{}x{}, {} classes", image_size_, image_size_, num_classes_);
  }

 private:
  int64_t batch_size_, image_size_, num_classes_;
  at::Generator generator_;
};

}  // namespace

std::unique_ptr<BatchSource> synthetic_source(int64_t batch_size, int64_t image_size, int64_t num_classes,
                                              uint64_t seed) {
  auto check = [](int64_t value, const char* what) {
    if (value < 1) throw std::invalid_argument(fmt::format("synthetic data: {} must be at least 1, got {}", what, value));
  };
  check(batch_size, "batch size");
  check(image_size, "image size");
  check(num_classes, "number of classes");
  return std::make_unique<SyntheticSource>(batch_size, image_size, num_classes, seed);
}

}  // namespace opfuse::data
