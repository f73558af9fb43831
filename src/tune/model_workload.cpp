// The C++ models as Workloads: fixed batches, a loss, SGD, and the model's own rewrites.
#include "tune/model_workload.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>

#include "opfuse/optim.h"
#include "opfuse/profile.h"

namespace opfuse::tune {
namespace {

constexpr int kBatches = 4;

std::unique_ptr<rewrite::Target> load_model(const TuneOptions& o) {
  if (is_file_model(o.model)) return rewrite::load_torchscript(o.model);
  return rewrite::efficientnet(o.model, o.image_size, o.num_classes, o.seed);
}

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kInputDtypes[] = {{"float32", at::kFloat}, {"float64", at::kDouble}, {"bfloat16", at::kBFloat16},
                                      {"int64", at::kLong},    {"int32", at::kInt},     {"bool", at::kBool}};

at::ScalarType dtype_of(const std::string& name) {
  for (const auto& d : kInputDtypes)
    if (name == d.name) return d.type;
  throw std::invalid_argument(fmt::format("unknown dtype '{}'", name));
}

bool is_integer(const std::string& dtype) { return dtype == "int64" || dtype == "int32"; }

// The whole of `text` as an integer ≥ 1, or 0.
int64_t positive_integer(const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    return 0;
  }
  return used == text.size() && v >= 1 ? v : 0;
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string dim = text.substr(at, comma - at);
    const int64_t d = positive_integer(dim);
    if (d == 0) throw std::invalid_argument(fmt::format("'{}' is not a positive dimension", dim));
    shape.push_back(d);
    at = comma + 1;
  }
  return shape;
}

}  // namespace

InputSpec parse_input_spec(const std::string& text) {
  try {
    InputSpec spec;
    const size_t colon = text.find(':');
    spec.shape = parse_shape(text.substr(0, colon));
    if (colon == std::string::npos) return spec;
    const std::string rest = text.substr(colon + 1);
    const size_t second = rest.find(':');
    spec.dtype = rest.substr(0, second);
    dtype_of(spec.dtype);  // throws for an unknown one
    if (second != std::string::npos) {
      if (!is_integer(spec.dtype)) throw std::invalid_argument(fmt::format("a {} input takes no bound", spec.dtype));
      const std::string high = rest.substr(second + 1);
      spec.high = positive_integer(high);
      if (spec.high == 0)
        throw std::invalid_argument(fmt::format("the bound '{}' is not a positive integer", high));
    } else if (is_integer(spec.dtype)) {
      throw std::invalid_argument(fmt::format("an {} input needs its values' bound, e.g. {}:{}:32000 for token ids",
                                              spec.dtype, text.substr(0, colon), spec.dtype));
    }
    return spec;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format(
        "--input-shape {}: {} (expected SHAPE[:DTYPE[:BOUND]], e.g. 16,3,224,224 or 8,64:int64:32000; dtypes "
        "float32, float64, bfloat16, int64, int32, bool)",
        text, e.what()));
  }
}

std::string to_string(const InputSpec& spec) {
  std::string out = fmt::format("{}", fmt::join(spec.shape, ","));
  if (spec.dtype != "float32") out += ":" + spec.dtype;
  if (spec.high > 0) out += fmt::format(":{}", spec.high);
  return out;
}

// Whatever its extension (.pt, .pth, .torchscript, none): torch.jit.save writes any name, so a
// model that is not one of the built-in names is a file.
bool is_file_model(const std::string& model) {
  return model.rfind("efficientnet-", 0) != 0 || std::filesystem::exists(model);
}

std::vector<InputSpec> input_specs(const TuneOptions& o) {
  if (!o.inputs.empty()) return o.inputs;
  if (is_file_model(o.model))
    throw std::invalid_argument(
        fmt::format("{}: a TorchScript model needs --input-shape, once per input of its forward (e.g. 16,3,224,224 "
                    "or 8,64:int64:32000)",
                    o.model));
  return {{{o.batch_size, 3, o.image_size, o.image_size}}};
}

namespace {

at::Tensor make_input(const InputSpec& spec, at::Generator& gen) {
  if (spec.dtype == "bool") return at::ones(spec.shape, at::kBool);
  if (spec.high > 0) return at::randint(spec.high, spec.shape, gen, at::dtype(dtype_of(spec.dtype)));
  return at::randn(spec.shape, gen, at::dtype(at::kFloat)).to(dtype_of(spec.dtype));
}

}  // namespace

at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, const std::string& loss) {
  if (loss == "mse") return torch::mse_loss(output, target);
  return torch::nn::functional::cross_entropy(output, target);
}

Batches make_batches(const TuneOptions& o, rewrite::Target& model) {
  Batches b;
  b.loss = o.loss;
  const std::vector<InputSpec> specs = input_specs(o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed + 7);
  for (int i = 0; i < kBatches; ++i) {
    b.inputs.emplace_back();
    for (const InputSpec& spec : specs) b.inputs.back().push_back(make_input(spec, gen));
  }
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

ModelWorkload::ModelWorkload(std::unique_ptr<rewrite::Target> model, std::shared_ptr<const Batches> batches, double lr,
                             bool fused_sgd)
    : model_(std::move(model)), batches_(std::move(batches)), lr_(lr), fused_sgd_(fused_sgd) {
  optimizer_ = make_optimizer();
  model_->set_training(true);
}

std::unique_ptr<torch::optim::Optimizer> ModelWorkload::make_optimizer() const {
  std::vector<at::Tensor> params;
  for (auto& [name, p] : model_->named_parameters()) params.push_back(p);
  return make_optimizer(params);
}

std::unique_ptr<torch::optim::Optimizer> ModelWorkload::make_optimizer(const std::vector<at::Tensor>& params) const {
  const auto options = torch::optim::SGDOptions(lr_).momentum(0.9).weight_decay(1e-5);
  if (fused_sgd_) return std::make_unique<optim::SGD>(params, options);
  return std::make_unique<torch::optim::SGD>(params, options);
}

std::map<std::string, int64_t> ModelWorkload::held_memory() {
  std::vector<at::Tensor> params, inputs;
  for (auto& [name, p] : model_->named_parameters()) params.push_back(p);
  for (const auto& batch : batches_->inputs) inputs.insert(inputs.end(), batch.begin(), batch.end());
  inputs.insert(inputs.end(), batches_->targets.begin(), batches_->targets.end());
  return profile::held_memory(params, optimizer_.get(), inputs);
}

std::string ModelWorkload::describe() const {
  return fused_sgd_ ? model_->describe() + " optimizer=opfuse::optim::SGD" : model_->describe();
}

std::shared_ptr<ModelWorkload> ModelWorkload::load(const TuneOptions& o) {
  std::unique_ptr<rewrite::Target> model = load_model(o);
  auto batches = std::make_shared<const Batches>(make_batches(o, *model));
  return std::make_shared<ModelWorkload>(std::move(model), std::move(batches), o.lr);
}

std::shared_ptr<Workload> ModelWorkload::clone() const {
  return std::make_shared<ModelWorkload>(model_->clone(), batches_, lr_, fused_sgd_);
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

namespace {

// t scaled element by element by (1 + nudge · noise): a rounding-sized change of it.
at::Tensor nudged(const at::Tensor& t, double nudge, at::Generator& gen) {
  return t * (1 + nudge * at::randn(t.sizes(), gen, t.options()));
}

// Floating inputs in the probe's dtype, nudged by `nudge` relative noise; token ids and masks as they are.
std::vector<at::Tensor> probe_inputs(const std::vector<at::Tensor>& inputs, at::ScalarType dtype, uint64_t seed,
                                     double nudge) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  std::vector<at::Tensor> out;
  for (const at::Tensor& x : inputs) {
    if (!x.is_floating_point()) {
      out.push_back(x);
      continue;
    }
    at::Tensor input = x.to(dtype);
    if (nudge > 0) input = nudged(input, nudge, gen);
    out.push_back(input);
  }
  return out;
}

}  // namespace

Probe ModelWorkload::probe(at::ScalarType dtype, uint64_t seed, double nudge) {
  model_->to(dtype);
  model_->set_training(true);
  model_->pass_dropout();
  const std::vector<at::Tensor> input = probe_inputs(batches_->inputs[0], dtype, seed, nudge);
  torch::manual_seed(seed);
  Probe run;
  const at::Tensor& target = batches_->targets[0];
  run.outputs = {model_->forward(input)};
  loss_of(run.outputs[0], target.is_floating_point() ? target.to(dtype) : target, batches_->loss).backward();
  for (auto& [name, p] : model_->named_parameters()) run.grads.emplace_back(name, p.grad());
  run.updates = updates(seed, nudge);
  return run;
}

// As the Python workload does it: two steps, so the momentum's buffer is made and then taken
// into the step (its first and its steady form), on gradients the same in both models, so a
// rewrite of the optimizer is verified on its own arithmetic. The nudged probe nudges the
// parameters too: an update read as p_after − p_before carries p's own rounding.
std::vector<std::pair<std::string, at::Tensor>> ModelWorkload::updates(uint64_t seed, double nudge) const {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (auto& [name, p] : model_->named_parameters())
    if (p.requires_grad()) named.emplace_back(name, p);
  if (nudge > 0) {
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 3);
    for (auto& [name, p] : named) p.copy_(nudged(p, nudge, gen));
  }
  std::vector<at::Tensor> params, before;
  for (auto& [name, p] : named) {
    params.push_back(p);
    before.push_back(p.detach().clone());
  }
  const auto optimizer = make_optimizer(params);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 2);
  for (int step = 0; step < 2; ++step) {
    // laid out as autograd lays out p's gradient: a fused step may read it with p's strides
    for (at::Tensor& p : params)
      p.mutable_grad() = at::empty_like(p).copy_(at::randn(p.sizes(), gen, at::TensorOptions().dtype(at::kDouble)));
    optimizer->step();
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < named.size(); ++i) out.emplace_back(named[i].first, params[i].detach() - before[i]);
  return out;
}

std::vector<Rewrite> ModelWorkload::rewrites_for(const analyze::Rule& rule) const {
  std::vector<Rewrite> out;
  if (rule.optimizer == "SGD")  // the workload's own optimizer is torch::optim::SGD
    out.push_back({rule.name, "torch::optim::SGD → opfuse::optim::SGD (opfuse::sgd_)", [](Workload& w) {
                     auto* m = dynamic_cast<ModelWorkload*>(&w);
                     if (m == nullptr || m->fused_sgd_) return 0;
                     m->fused_sgd_ = true;
                     m->optimizer_ = m->make_optimizer();
                     return 1;
                   }});
  if (!rule.memory_format.empty())  // channels_last, the one a rule may name (rules.cpp)
    out.push_back({rule.name, "the model's 4-d parameters and buffers -> channels_last", [](Workload& w) {
                     auto* m = dynamic_cast<ModelWorkload*>(&w);
                     const int moved = m == nullptr ? 0 : m->model().to_channels_last();
                     if (moved > 0) m->optimizer_ = m->make_optimizer();  // no state kept in the old layout
                     return moved;
                   }});
  for (rewrite::Rewriter& rw : rewrite::rewriters_for(rule)) {
    auto apply = rw.apply;
    out.push_back({rw.rule, rw.name, [apply](Workload& w) {
                     auto* m = dynamic_cast<ModelWorkload*>(&w);
                     return m == nullptr ? 0 : apply(m->model());
                   }});
  }
  return out;
}

}  // namespace opfuse::tune
