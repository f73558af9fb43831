// The C++ models as Workloads: a rewrite::Target trained with SGD on fixed synthetic batches.
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
  std::vector<std::vector<at::Tensor>> inputs;  // per batch, forward's positional inputs
  std::vector<at::Tensor> targets;
  std::string loss;  // ce | mse
};

// Whether options.model names a TorchScript file (any name but a built-in model's) rather than a built-in model.
bool is_file_model(const std::string& model);
// The inputs of options.model's forward; throws std::invalid_argument for a TorchScript model
// without --input-shape.
std::vector<InputSpec> input_specs(const TuneOptions& o);
// Draws the batches; the targets' shape comes from one forward pass of `model` in eval mode.
Batches make_batches(const TuneOptions& o, rewrite::Target& model);

at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, const std::string& loss);

class ModelWorkload : public Workload {
 public:
  // SGD with momentum 0.9 and weight decay 1e-5 (the reference's ImageNet recipe) at options.lr:
  // torch's, or opfuse::optim::SGD once a fused_sgd rewrite took its place.
  ModelWorkload(std::unique_ptr<rewrite::Target> model, std::shared_ptr<const Batches> batches, double lr,
                bool fused_sgd = false);
  // The model options.model names (built-in or TorchScript file), with its batches.
  static std::shared_ptr<ModelWorkload> load(const TuneOptions& o);

  std::string name() const override { return model_->name(); }
  std::string describe() const override;
  int64_t samples_per_step() const override { return batches_->inputs.front().front().size(0); }
  // A batch of [N, C, H, W] floats is N images (EfficientNet, a scripted vision model).
  std::string sample_unit() const override {
    const at::Tensor& x = batches_->inputs.front().front();
    return x.dim() == 4 && x.is_floating_point() ? "images" : "samples";
  }
  std::shared_ptr<Workload> clone() const override;
  double step() override;
  Probe probe(at::ScalarType dtype, uint64_t seed, double nudge) override;
  std::vector<Rewrite> rewrites_for(const analyze::Rule& rule) const override;
  std::vector<std::string> save(const std::string& path) const override { return model_->save(path); }
  std::map<std::string, int64_t> held_memory() override;

  rewrite::Target& model() { return *model_; }

 private:
  std::unique_ptr<rewrite::Target> model_;
  std::shared_ptr<const Batches> batches_;
  // SGD over the model's parameters: torch's, or opfuse's once fused_sgd_ is set.
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& params) const;
  std::unique_ptr<torch::optim::Optimizer> make_optimizer() const;
  // What two steps of a fresh optimizer do to each parameter from gradients drawn from `seed`:
  // it steps this workload's parameters (probe's callers run it on a clone).
  std::vector<std::pair<std::string, at::Tensor>> updates(uint64_t seed, double nudge) const;

  double lr_;
  bool fused_sgd_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  size_t next_ = 0;
};

}  // namespace opfuse::tune
