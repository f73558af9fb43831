// The C++ models as Workloads: fixed batches, a loss, SGD, and the model's own rewrites.
#include "tune/model_workload.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "opfuse/profile.h"

namespace opfuse::tune {
namespace {

constexpr int kBatches = 4;

std::unique_ptr<rewrite::Model> load_model(const TuneOptions& o) {
  if (is_file_model(o.model)) return rewrite::load_torchscript(o.model);
  return rewrite::efficientnet(o.model, o.image_size, o.num_classes, o.seed);
}

}  // namespace

// Whatever its extension (.pt, .pth, .torchscript, none): torch.jit.save writes any name, so a
// model that is not one of the built-in names is a file.
bool is_file_model(const std::string& model) {
  return model.rfind("efficientnet-", 0) != 0 || std::filesystem::exists(model);
}

std::vector<int64_t> input_shape(const TuneOptions& o) {
  if (!o.input_shape.empty()) return o.input_shape;
  if (is_file_model(o.model))
    throw std::invalid_argument(fmt::format("{}: a TorchScript model needs --input-shape (e.g. 16,3,224,224)", o.model));
  return {o.batch_size, 3, o.image_size, o.image_size};
}

at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, const std::string& loss) {
  if (loss == "mse") return torch::mse_loss(output, target);
  return torch::nn::functional::cross_entropy(output, target);
}

Batches make_batches(const TuneOptions& o, rewrite::Model& model) {
  Batches b;
  b.loss = o.loss;
  const std::vector<int64_t> shape = input_shape(o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed + 7);
  for (int i = 0; i < kBatches; ++i)
    b.inputs.push_back(at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)));
  at::Tensor probe;
  {
    torch::NoGradGuard no_grad;
    model.set_training(false);
    probe = model.forward(b.inputs[0]);
    model.set_training(true);
  }
  if (o.loss == "ce" && probe.dim() != 2)
    throw std::invalid_argument(fmt::format("{}: --loss ce needs a [batch, classes] output, the model gives {}",
                                            o.model, fmt::join(probe.sizes(), "x")));
  for (int i = 0; i < kBatches; ++i)
    b.targets.push_back(o.loss == "ce" ? at::randint(probe.size(1), {probe.size(0)}, gen, at::kLong)
                                       : at::randn(probe.sizes(), gen, at::TensorOptions().dtype(at::kFloat)));
  return b;
}

ModelWorkload::ModelWorkload(std::unique_ptr<rewrite::Model> model, std::shared_ptr<const Batches> batches, double lr)
    : model_(std::move(model)), batches_(std::move(batches)), lr_(lr) {
  std::vector<at::Tensor> params;
  for (auto& [name, p] : model_->named_parameters()) params.push_back(p);
  optimizer_ = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(1e-5));
  model_->set_training(true);
}

std::shared_ptr<ModelWorkload> ModelWorkload::load(const TuneOptions& o) {
  std::unique_ptr<rewrite::Model> model = load_model(o);
  auto batches = std::make_shared<const Batches>(make_batches(o, *model));
  return std::make_shared<ModelWorkload>(std::move(model), std::move(batches), o.lr);
}

std::shared_ptr<Workload> ModelWorkload::clone() const {
  return std::make_shared<ModelWorkload>(model_->clone(), batches_, lr_);
}

double ModelWorkload::step() {
  const auto start = std::chrono::steady_clock::now();
  const size_t i = next_++ % batches_->inputs.size();
  optimizer_->zero_grad();
  loss_of(model_->forward(batches_->inputs[i]), batches_->targets[i], batches_->loss).backward();
  {
    profile::Scope scope("Optimizer.step#SGD.step");  // named as PyTorch's profiler names it
    optimizer_->step();
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

Probe ModelWorkload::probe(at::ScalarType dtype, uint64_t seed, double nudge) {
  model_->to(dtype);
  model_->set_training(true);
  model_->pass_dropout();
  at::Tensor input = batches_->inputs[0].to(dtype);
  if (nudge > 0) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
    input = input * (1 + nudge * at::randn(input.sizes(), gen, input.options()));
  }
  torch::manual_seed(seed);
  Probe run;
  const at::Tensor& target = batches_->targets[0];
  run.outputs = {model_->forward(input)};
  loss_of(run.outputs[0], target.is_floating_point() ? target.to(dtype) : target, batches_->loss).backward();
  for (auto& [name, p] : model_->named_parameters()) run.grads.emplace_back(name, p.grad());
  return run;
}

std::vector<Rewrite> ModelWorkload::rewrites_for(const analyze::Rule& rule) const {
  std::vector<Rewrite> out;
  for (rewrite::Rewrite& rw : rewrite::rewrites_for(rule)) {
    auto apply = rw.apply;
    out.push_back({rw.rule, rw.name, [apply](Workload& w) {
                     auto* m = dynamic_cast<ModelWorkload*>(&w);
                     return m == nullptr ? 0 : apply(m->model());
                   }});
  }
  return out;
}

}  // namespace opfuse::tune
