// rewrite::Target for the built-in EfficientNet and for TorchScript modules.
#include "rewrite/targets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/torch.h>

#include <fstream>
#include <unordered_set>

namespace opfuse::rewrite {
namespace {

// The 4-d tensors not channels-last already, moved there in place; how many moved.
int move_to_channels_last(const std::vector<at::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  int moved = 0;
  for (at::Tensor t : tensors)
    if (t.dim() == 4 && !t.is_contiguous(at::MemoryFormat::ChannelsLast)) {
      t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
      ++moved;
    }
  return moved;
}

}  // namespace

EfficientNetTarget::EfficientNetTarget(std::string name, int image_size, int num_classes)
    : name_(std::move(name)), image_size_(image_size), num_classes_(num_classes) {
  net = models::make_efficientnet(name_, num_classes, image_size);
}

int EfficientNetTarget::fuse(const std::string& rule) {
  const int places = fuse_efficientnet(*net, rule);
  if (places > 0) fused.push_back(rule);
  return places;
}

std::vector<std::pair<std::string, at::Tensor>> EfficientNetTarget::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : net->named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

int EfficientNetTarget::to_channels_last() {
  std::vector<at::Tensor> tensors = net->parameters();
  for (const at::Tensor& b : net->buffers()) tensors.push_back(b);
  const int moved = move_to_channels_last(tensors);
  channels_last |= moved > 0;
  return moved;
}

// Same architecture, then every parameter and buffer copied by name: the clone starts where this
// model is, including BatchNorm's running statistics (copied into its layout).
std::unique_ptr<Target> EfficientNetTarget::clone() const {
  auto copy = std::make_unique<EfficientNetTarget>(name_, image_size_, num_classes_);
  for (const std::string& rule : fused) copy->fuse(rule);
  if (channels_last) copy->to_channels_last();
  copy->net->train(net->is_training());
  torch::NoGradGuard no_grad;
  auto params = net->named_parameters();
  for (auto& p : copy->net->named_parameters()) p.value().copy_(params[p.key()]);
  auto buffers = net->named_buffers();
  for (auto& b : copy->net->named_buffers()) b.value().copy_(buffers[b.key()]);
  return copy;
}

std::vector<std::string> EfficientNetTarget::save(const std::string& base) const {
  const std::string weights = base + ".pt", config = base + ".json";
  torch::serialize::OutputArchive archive;
  net->save(archive);
  archive.save_to(weights);
  std::ofstream out(config);
  out << nlohmann::json{{"model", name_},
                        {"image_size", image_size_},
                        {"num_classes", num_classes_},
                        {"fusions", fused},
                        {"memory_format", channels_last ? "channels_last" : "contiguous"},
                        {"weights", weights}}
             .dump(2)
      << "\n";
  if (!out) throw std::runtime_error(fmt::format("{}: cannot write", config));
  return {weights, config};
}

std::string EfficientNetTarget::describe() const {
  const std::string layout = channels_last ? " (channels-last)" : "";
  return fused.empty() ? "reference" + layout : fmt::format("fused: {}{}", fmt::join(fused, ", "), layout);
}

std::unique_ptr<Target> efficientnet(const std::string& name, int image_size, int num_classes, uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_unique<EfficientNetTarget>(name, image_size, num_classes);
}

TorchScriptTarget::TorchScriptTarget(torch::jit::Module m, std::string name)
    : module(std::move(m)), name_(std::move(name)) {}

at::Tensor TorchScriptTarget::forward(const std::vector<at::Tensor>& inputs) {
  c10::IValue out = module.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end()));
  if (out.isTuple()) out = out.toTupleRef().elements().at(0);  // (logits, aux…): train on the first
  if (!out.isTensor()) throw std::invalid_argument(fmt::format("{}: forward returns no tensor", name_));
  return out.toTensor();
}

// A tensor held under two names (an LM head tied to its embedding) is listed once, under its
// first name, as Python's named_parameters() does: listed twice, an optimizer steps it twice.
std::vector<std::pair<std::string, at::Tensor>> TorchScriptTarget::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (seen.insert(p.value.unsafeGetTensorImpl()).second) out.emplace_back(p.name, p.value);
  return out;
}

// clone() gives the copy its own class types, so a graph rewrite on it leaves this one alone,
// and deep-copies the tensors. (Frozen parameters would come back trainable; scripted modules
// seldom have them.)
void TorchScriptTarget::pass_dropout() {
  for (torch::jit::Module m : module.modules())  // a handle: train() sets the shared object's flag
    if (m.type()->name() && m.type()->name()->name().find("Dropout") != std::string::npos) m.train(false);
}

int TorchScriptTarget::to_channels_last() {
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& p : module.parameters(/*recurse=*/true)) tensors.push_back(p);
  for (const at::Tensor& b : module.buffers(/*recurse=*/true)) tensors.push_back(b);
  const int moved = move_to_channels_last(tensors);
  if (moved > 0) applied.push_back("channels_last");
  return moved;
}

std::unique_ptr<Target> TorchScriptTarget::clone() const {
  torch::jit::Module copied;
  {
    // Copied under autograd, parameters would be outputs of a clone op, not leaves to train.
    torch::NoGradGuard no_grad;
    copied = module.clone();
  }
  for (const auto& p : copied.named_parameters(/*recurse=*/true)) p.value.requires_grad_(true);
  auto copy = std::make_unique<TorchScriptTarget>(std::move(copied), name_);
  copy->applied = applied;
  return copy;
}

std::vector<std::string> TorchScriptTarget::save(const std::string& base) const {
  const std::string path = base + ".pt";
  module.save(path);
  return {path};
}

std::string TorchScriptTarget::describe() const {
  if (applied.empty()) return "as loaded";
  std::string out;
  for (const auto& a : applied) out += (out.empty() ? "" : ", ") + a;
  return out;
}

std::unique_ptr<Target> load_torchscript(const std::string& path) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(path);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw std::invalid_argument(fmt::format("{}: not a TorchScript module ({})", path, what.substr(0, what.find('\n'))));
  }
  if (!m.find_method("forward")) throw std::invalid_argument(fmt::format("{}: the module has no forward method", path));
  return std::make_unique<TorchScriptTarget>(std::move(m), path);
}

bool is_torchscript(const Target& model) { return dynamic_cast<const TorchScriptTarget*>(&model) != nullptr; }

void save_torchscript(const Target& model, const std::string& path) {
  const auto* ts = dynamic_cast<const TorchScriptTarget*>(&model);
  if (ts == nullptr) throw std::invalid_argument(fmt::format("{} is no TorchScript module to save as {}", model.name(), path));
  ts->module.save(path);
}

}  // namespace opfuse::rewrite
