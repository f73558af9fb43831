// The models tune can rewrite, and the rewrites it knows: module swaps on the built-in
// EfficientNet and TorchScript graph rewrites (torch::jit::SubgraphRewriter) on any scripted or
// traced module. A rewrite answers one analyze rule; applying it to a clone leaves the original
// untouched, so a rewrite that fails verification is rolled back by dropping the clone.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "opfuse/analyze.h"

namespace opfuse::models {
class EfficientNetImpl;
}

namespace opfuse::rewrite {

// A model tune trains, profiles, rewrites and checks.
class Target {
 public:
  virtual ~Target() = default;
  virtual std::string name() const = 0;
  // forward's positional inputs; a model that returns a tuple trains on its first element.
  virtual at::Tensor forward(const std::vector<at::Tensor>& inputs) = 0;
  // The trainable parameters, named, in a stable order (the same for a clone).
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters() = 0;
  virtual void set_training(bool on) = 0;
  // Dropout modules pass their input through (the rest stays in training mode): a fused op draws
  // its own mask (attention's is never stored), so verification compares the mathematics.
  virtual void pass_dropout() {}
  // Converts parameters and buffers (float64 for the reference verification runs against).
  virtual void to(at::ScalarType dtype) = 0;
  // Moves the 4-d parameters and buffers not channels-last already to channels-last, in place
  // (the same tensors, which an optimizer may hold); returns how many moved.
  virtual int to_channels_last() = 0;
  // A model with its own copy of every parameter and buffer and its own rewrites.
  virtual std::unique_ptr<Target> clone() const = 0;
  // Writes the model so it can be used: TorchScript for scripted models, weights and a config
  // for built-in ones. Returns the paths written.
  virtual std::vector<std::string> save(const std::string& path_without_extension) const = 0;
  // What has been rewritten so far, e.g. "swish=fused se_gate=composite".
  virtual std::string describe() const = 0;
};

// efficientnet-b0…b7, built as the reference ships it (memory-efficient Swish, composite SE tail),
// parameters drawn from `seed`.
std::unique_ptr<Target> efficientnet(const std::string& name, int image_size, int num_classes, uint64_t seed);

// A module saved with torch.jit.save / torch::jit::Module::save. Throws std::invalid_argument
// naming the file when it cannot be loaded or has no forward.
std::unique_ptr<Target> load_torchscript(const std::string& path);

// The fusions the built-in EfficientNet takes by module swap, by rule name: silu, se_gate,
// batch_norm_silu, drop_connect_add.
struct ModuleFusion {
  std::string rule;  // "silu"
  std::string what;  // for people: "Swish modules → opfuse::silu"
};
const std::vector<ModuleFusion>& efficientnet_fusions();
// Swaps net's reference modules at the rule's fusion points for fused ones; returns how many
// places changed (0 where done before). Throws std::invalid_argument for a rule it has no swap for.
int fuse_efficientnet(models::EfficientNetImpl& net, const std::string& rule);

struct Rewriter {
  std::string rule;  // the analyze rule whose finding it answers ("silu")
  std::string name;  // what it does, for people: "Swish modules → opfuse::silu"
  // Rewrites the model in place; returns how many places changed (0: it does not apply here).
  std::function<int(Target&)> apply;
};

// The rewrites for a rule on this kind of model: the built-in module swaps, and one per
// TorchScript pattern pair the rule carries.
std::vector<Rewriter> rewriters_for(const analyze::Rule& rule);

// One TorchScript pattern pair applied to every method graph of the module and its submodules
// (with inline_calls, after the module's forward is inlined: a pattern across module calls);
// returns how many matches were replaced. Throws std::invalid_argument for a pattern that does
// not parse.
int rewrite_graph(Target& model, const std::string& pattern, const std::string& replacement, bool inline_calls = false);

// Whether the model is a TorchScript module (graph rewrites apply) or a built-in one.
bool is_torchscript(const Target& model);
// Writes a TorchScript target's module to path, as torch.jit.save does; throws
// std::invalid_argument for a target of another kind.
void save_torchscript(const Target& model, const std::string& path);

}  // namespace opfuse::rewrite
