// The C++ models as Workloads: a rewrite::Model trained with SGD on fixed synthetic batches.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "opfuse/rewrite.h"
#include "opfuse/tune.h"
#include "opfuse/workload.h"

namespace opfuse::tune {

// A few batches drawn once from the seed and cycled, so every variant sees the same data and no
// data loading reaches the timings.
struct Batches {
  std::vector<at::Tensor> inputs, targets;
  std::string loss;  // ce | mse
};

// Whether options.model names a TorchScript file (any name but a built-in model's) rather than a built-in model.
bool is_file_model(const std::string& model);
// The input shape of options.model; throws std::invalid_argument for a TorchScript model without one.
std::vector<int64_t> input_shape(const TuneOptions& o);
// Draws the batches; the targets' shape comes from one forward pass of `model` in eval mode.
Batches make_batches(const TuneOptions& o, rewrite::Model& model);

at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, const std::string& loss);

class ModelWorkload : public Workload {
 public:
  // SGD with momentum 0.9 and weight decay 1e-5 (the reference's ImageNet recipe) at options.lr.
  ModelWorkload(std::unique_ptr<rewrite::Model> model, std::shared_ptr<const Batches> batches, double lr);
  // The model options.model names (built-in or TorchScript file), with its batches.
  static std::shared_ptr<ModelWorkload> load(const TuneOptions& o);

  std::string name() const override { return model_->name(); }
  std::string describe() const override { return model_->describe(); }
  int64_t samples_per_step() const override { return batches_->inputs.front().size(0); }
  // A batch of [N, C, H, W] floats is N images (EfficientNet, a scripted vision model).
  std::string sample_unit() const override {
    const at::Tensor& x = batches_->inputs.front();
    return x.dim() == 4 && x.is_floating_point() ? "images" : "samples";
  }
  std::shared_ptr<Workload> clone() const override;
  double step() override;
  Probe probe(at::ScalarType dtype, uint64_t seed, double nudge) override;
  std::vector<Rewrite> rewrites_for(const analyze::Rule& rule) const override;
  std::vector<std::string> save(const std::string& path) const override { return model_->save(path); }

  rewrite::Model& model() { return *model_; }

 private:
  std::unique_ptr<rewrite::Model> model_;
  std::shared_ptr<const Batches> batches_;
  double lr_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  size_t next_ = 0;
};

// Verifies `candidate` against `baseline` (neither is changed: both run as clones).
Verdict verify(const Workload& baseline, const Workload& candidate, uint64_t seed);
// "failed verification (gradient of _fc.weight off by 0.31)", for a verdict that did not pass.
std::string rejection(const Verdict& v);

}  // namespace opfuse::tune
