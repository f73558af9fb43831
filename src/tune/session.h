// Training a rewrite::Model on fixed synthetic batches: what tune profiles, verifies and times.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "opfuse/rewrite.h"
#include "opfuse/tune.h"

namespace opfuse::tune {

// A few batches drawn once from the seed and cycled, so every variant sees the same data and no
// data loading reaches the timings.
struct Batches {
  std::vector<at::Tensor> inputs, targets;
  std::string loss;  // ce | mse
};

// Whether options.model names a TorchScript file rather than a built-in model.
bool is_file_model(const std::string& model);
// The input shape of options.model; throws std::invalid_argument for a TorchScript model without one.
std::vector<int64_t> input_shape(const TuneOptions& o);
// Draws the batches; the targets' shape comes from one forward pass of `model` in eval mode.
Batches make_batches(const TuneOptions& o, rewrite::Model& model);

at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, const std::string& loss);

class Session {
 public:
  Session(std::unique_ptr<rewrite::Model> model, const Batches& batches, const TuneOptions& o);
  double step();  // one training step; returns its milliseconds
  rewrite::Model& model() { return *model_; }

 private:
  std::unique_ptr<rewrite::Model> model_;
  const Batches& batches_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  size_t next_ = 0;
};

// Verifies `candidate` against `baseline` (neither is changed: both run as clones) on the first batch.
Verdict verify(const rewrite::Model& baseline, const rewrite::Model& candidate, const Batches& batches, uint64_t seed);
// "failed verification (gradient of _fc.weight off by 0.31)", for a verdict that did not pass.
std::string rejection(const Verdict& v);

}  // namespace opfuse::tune
