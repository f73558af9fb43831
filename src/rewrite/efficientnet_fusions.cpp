// The built-in EfficientNet's fusions by module swap: each replaces the model's reference modules
// at one kind of fusion point (opfuse/efficientnet.h) by a subclass that computes the same with
// an opfuse op.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

#include "opfuse/efficientnet.h"
#include "opfuse/ops.h"
#include "opfuse/profile.h"
#include "opfuse/rewrite.h"

namespace opfuse::rewrite {
namespace {

using models::EfficientNetImpl;
using models::MBConvBlockImpl;

class FusedSiluImpl : public models::SwishImpl {
 public:
  FusedSiluImpl() { spelling = "opfuse::silu"; }
  at::Tensor forward(const at::Tensor& x) override { return opfuse::silu(x); }
};

// One opfuse::batch_norm_silu on the BatchNorm's parameters, buffers and mode, including its
// num_batches_tracked count and momentum as BatchNorm2d's own forward keeps them. It runs in the
// BatchNorm's scope: a trace shows it where the BatchNorm and the Swish after it were.
class FusedBatchNormSiluImpl : public models::BatchNormSwishImpl {
 public:
  using BatchNormSwishImpl::BatchNormSwishImpl;
  at::Tensor forward(const at::Tensor& x) override {
    profile::Scope scope(bn_scope);
    torch::nn::BatchNorm2dImpl& norm = **bn;
    const auto& o = norm.options;
    double momentum = o.momentum().value_or(0.0);
    if (norm.is_training() && o.track_running_stats() && norm.num_batches_tracked.defined()) {
      norm.num_batches_tracked += 1;
      if (!o.momentum().has_value()) momentum = 1.0 / norm.num_batches_tracked.item<double>();  // cumulative average
    }
    const bool batch_statistics = norm.is_training() || !o.track_running_stats();
    return opfuse::batch_norm_silu(x, norm.weight, norm.bias, norm.running_mean, norm.running_var, batch_statistics,
                                   momentum, o.eps());
  }
};

class FusedSeGateImpl : public models::SqueezeExcitationGateImpl {
 public:
  at::Tensor forward(const at::Tensor& x, const at::Tensor& gate) override { return opfuse::se_gate(x, gate); }
};

// The same mask as the reference's drop_connect for the same seed.
class FusedDropConnectAddImpl : public models::DropConnectAddImpl {
 public:
  at::Tensor forward(const at::Tensor& x, const at::Tensor& inputs, double drop_connect_rate) override {
    return opfuse::drop_connect_add(x, inputs, drop_connect_rate, is_training());
  }
};

// Puts `fused` where owner's submodule `name` (held in `field`) was; false where the model has
// no such module there or it is fused already.
template <typename Holder, typename Fused>
bool swap(torch::nn::Module& owner, const char* name, Holder& field, std::shared_ptr<Fused> fused) {
  if (field.is_empty() || dynamic_cast<Fused*>(field.get()) != nullptr) return false;
  fused->train(owner.is_training());
  field = owner.replace_module(name, Holder(std::shared_ptr<typename Holder::ContainedType>(std::move(fused))));
  return true;
}

int fuse_silu(EfficientNetImpl& net) {
  int places = swap(net, "_swish", net._swish, std::make_shared<FusedSiluImpl>());
  for (MBConvBlockImpl* b : net.blocks()) places += swap(*b, "_swish", b->_swish, std::make_shared<FusedSiluImpl>());
  return places;
}

int fuse_se_gate(EfficientNetImpl& net) {
  int places = 0;
  for (MBConvBlockImpl* b : net.blocks()) places += swap(*b, "_se_gate", b->_se_gate, std::make_shared<FusedSeGateImpl>());
  return places;
}

int fuse_batch_norm_silu(EfficientNetImpl& net) {
  auto fused = [](const models::BatchNormSwish& site) {
    return site.is_empty() ? nullptr
                           : std::make_shared<FusedBatchNormSiluImpl>(site->bn, site->swish, site->bn_scope,
                                                                      site->swish_scope);
  };
  int places = swap(net, "_bn0_swish", net._bn0_swish, fused(net._bn0_swish)) +
               swap(net, "_bn1_swish", net._bn1_swish, fused(net._bn1_swish));
  for (MBConvBlockImpl* b : net.blocks())
    places += swap(*b, "_bn0_swish", b->_bn0_swish, fused(b->_bn0_swish)) +
              swap(*b, "_bn1_swish", b->_bn1_swish, fused(b->_bn1_swish));
  return places;
}

int fuse_drop_connect_add(EfficientNetImpl& net) {
  int places = 0;
  for (MBConvBlockImpl* b : net.blocks())
    places += swap(*b, "_drop_connect_add", b->_drop_connect_add, std::make_shared<FusedDropConnectAddImpl>());
  return places;
}

struct Swap {
  ModuleFusion fusion;
  int (*apply)(EfficientNetImpl&);
};

const std::vector<Swap>& swaps() {
  static const std::vector<Swap> table = {
      {{"silu", "Swish modules → opfuse::silu"}, fuse_silu},
      {{"se_gate", "squeeze-and-excitation tail sigmoid(s)·x → opfuse::se_gate"}, fuse_se_gate},
      {{"batch_norm_silu", "BatchNorm + Swish → opfuse::batch_norm_silu"}, fuse_batch_norm_silu},
      {{"drop_connect_add", "drop connect + residual add → opfuse::drop_connect_add"}, fuse_drop_connect_add},
  };
  return table;
}

}  // namespace

const std::vector<ModuleFusion>& efficientnet_fusions() {
  static const std::vector<ModuleFusion> fusions = [] {
    std::vector<ModuleFusion> out;
    for (const Swap& s : swaps()) out.push_back(s.fusion);
    return out;
  }();
  return fusions;
}

int fuse_efficientnet(EfficientNetImpl& net, const std::string& rule) {
  for (const Swap& s : swaps())
    if (s.fusion.rule == rule) return s.apply(net);
  std::vector<std::string> names;
  for (const Swap& s : swaps()) names.push_back(s.fusion.rule);
  throw std::invalid_argument(fmt::format("no module swap for '{}' on EfficientNet (expected {})", rule, fmt::join(names, ", ")));
}

}  // namespace opfuse::rewrite
