// EfficientNet-B0…B7 in LibTorch, faithful to the reference implementation
// (lukemelas/efficientnet_pytorch): block strings, compound scaling, TF "SAME" static padding,
// BN momentum 0.01 / eps 1e-3, drop connect — and parameter names as in its state_dict.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

namespace opfuse::models {

// How Swish is computed; switchable on a built model, as the reference's set_swish.
enum class SwishKind { memory_efficient, composite, aten, fused };
// How the squeeze-and-excitation tail sigmoid(s) · x is computed.
enum class SeGateKind { composite, fused };
// How each BatchNorm followed by Swish (stem, expansion, depthwise, head) is computed: the
// BatchNorm2d module then the Swish variant, or one opfuse::batch_norm_silu on the module's
// parameters and buffers.
enum class BatchNormSiluKind { composite, fused };
// How a block's drop connect + residual add is computed: the reference's drop_connect then
// `+ inputs`, or one opfuse::drop_connect_add (the same mask for the same seed).
enum class DropConnectKind { composite, fused };

// "composite" | "fused" for the three kinds above; throws std::invalid_argument naming `what`.
SeGateKind parse_se_gate_kind(const std::string& name);
BatchNormSiluKind parse_batch_norm_silu_kind(const std::string& name);
DropConnectKind parse_drop_connect_kind(const std::string& name);

SwishKind parse_swish_kind(const std::string& name);  // throws std::invalid_argument
std::string to_string(SwishKind kind);
const std::vector<std::string>& swish_kind_names();

// One "r1_k3_s11_e1_i32_o16_se0.25" block string, decoded.
struct BlockArgs {
  int num_repeat = 1, kernel_size = 3, stride = 1, expand_ratio = 1;
  int input_filters = 0, output_filters = 0;
  double se_ratio = 0;  // 0: no squeeze-and-excitation
  bool id_skip = true;
};
BlockArgs decode_block_string(const std::string& block);  // throws std::invalid_argument

struct GlobalParams {
  double width = 1.0, depth = 1.0;
  int image_size = 224;
  double dropout_rate = 0.2;
  int num_classes = 1000;
  double batch_norm_momentum = 0.01, batch_norm_epsilon = 1e-3;
  double drop_connect_rate = 0.2;
  int depth_divisor = 8;
};

// efficientnet-b0 … efficientnet-b7 (width, depth, resolution, dropout); throws for other names.
GlobalParams efficientnet_params(const std::string& model_name, int num_classes = 1000);
const std::vector<std::string>& efficientnet_names();
int round_filters(int filters, const GlobalParams& p);
int round_repeats(int repeats, const GlobalParams& p);

// Conv2d whose padding is fixed at construction from the image size, as TF's "SAME":
// total padding max((⌈i/s⌉ − 1)·s + k − i, 0), the odd pixel going to the bottom/right.
class Conv2dStaticSamePaddingImpl : public torch::nn::Module {
 public:
  Conv2dStaticSamePaddingImpl(int in, int out, int kernel, int stride, int groups, bool bias, int image_size);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;

 private:
  int64_t stride_, groups_;
  std::vector<int64_t> padding_;  // left, right, top, bottom
};
TORCH_MODULE(Conv2dStaticSamePadding);

class SwishImpl : public torch::nn::Module {
 public:
  explicit SwishImpl(SwishKind kind = SwishKind::memory_efficient) : kind(kind) {}
  at::Tensor forward(const at::Tensor& x);
  SwishKind kind;
};
TORCH_MODULE(Swish);

class MBConvBlockImpl : public torch::nn::Module {
 public:
  MBConvBlockImpl(const BlockArgs& args, const GlobalParams& p, int image_size);
  at::Tensor forward(const at::Tensor& inputs, double drop_connect_rate);
  at::Tensor squeeze_excite(const at::Tensor& x);
  // swish(bn(x)) in the profiler scope of bn, fused or not as bn_silu says.
  at::Tensor bn_swish(torch::nn::BatchNorm2d& bn, const std::string& bn_scope, const at::Tensor& x);
  // Names the profiler scopes after the module's path in the model, e.g. "_blocks.3".
  void set_path(const std::string& path);
  BlockArgs args;
  struct ScopeNames {
    std::string block, expand_conv, bn0, depthwise_conv, bn1, se, swish, project_conv, bn2;
  } scope;
  SeGateKind se_gate = SeGateKind::composite;
  BatchNormSiluKind bn_silu = BatchNormSiluKind::composite;
  DropConnectKind drop_connect = DropConnectKind::composite;
  Conv2dStaticSamePadding _expand_conv{nullptr}, _depthwise_conv{nullptr}, _se_reduce{nullptr},
      _se_expand{nullptr}, _project_conv{nullptr};
  torch::nn::BatchNorm2d _bn0{nullptr}, _bn1{nullptr}, _bn2{nullptr};
  Swish _swish{nullptr};
};
TORCH_MODULE(MBConvBlock);

class EfficientNetImpl : public torch::nn::Module {
 public:
  EfficientNetImpl(const std::vector<BlockArgs>& blocks, const GlobalParams& p);
  at::Tensor forward(const at::Tensor& x);
  void set_swish(SwishKind kind);
  void set_se_gate(SeGateKind kind);
  void set_batch_norm_silu(BatchNormSiluKind kind);
  void set_drop_connect(DropConnectKind kind);
  int64_t parameter_count() const;
  BatchNormSiluKind bn_silu = BatchNormSiluKind::composite;  // stem and head; blocks keep their own
  // swish(bn(x)) for the stem's _bn0 and the head's _bn1, in the BatchNorm's profiler scope.
  at::Tensor stem_or_head_bn_swish(torch::nn::BatchNorm2d& bn, const char* bn_scope, const at::Tensor& x);
  GlobalParams params;
  Conv2dStaticSamePadding _conv_stem{nullptr}, _conv_head{nullptr};
  torch::nn::BatchNorm2d _bn0{nullptr}, _bn1{nullptr};
  torch::nn::ModuleList _blocks;
  torch::nn::Dropout _dropout{nullptr};
  torch::nn::Linear _fc{nullptr};
  Swish _swish{nullptr};
};
TORCH_MODULE(EfficientNet);

// silu(bn(x)) as one opfuse::batch_norm_silu with the module's parameters, buffers and mode,
// including its num_batches_tracked count and momentum, as BatchNorm2d's own forward.
at::Tensor fused_batch_norm_silu(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x);

// The B0 block strings; every variant scales them.
const std::vector<std::string>& efficientnet_block_strings();

// Builds efficientnet-bN; image_size 0 means the variant's own resolution.
EfficientNet make_efficientnet(const std::string& model_name, int num_classes = 1000, int image_size = 0);

}  // namespace opfuse::models
