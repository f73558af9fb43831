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

// The Swish spellings a model is built with: the reference's memory-efficient autograd Function,
// x · sigmoid(x) through autograd ("composite"), or torch's silu ("aten").
const std::vector<std::string>& swish_spellings();
// Throws std::invalid_argument naming the spellings for one that is none of them.
void check_swish_spelling(const std::string& spelling);

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

// The model's reference modules where a fusion may go: each computes as the reference does, and
// a rewrite swaps it (Module::replace_module) for a subclass that computes the same with a fused
// op. The model calls them through their virtual forward and never asks which it holds.

// Swish, in one of swish_spellings().
class SwishImpl : public torch::nn::Module {
 public:
  explicit SwishImpl(std::string spelling = "memory-efficient");  // throws std::invalid_argument
  virtual at::Tensor forward(const at::Tensor& x);
  std::string spelling;
};
TORCH_MODULE(Swish);

// swish(bn(x)) at each BatchNorm a Swish follows, each in its own profiler scope. Holds no
// tensors: it calls its owner's BatchNorm and Swish, which may be swapped after it is made.
class BatchNormSwishImpl : public torch::nn::Module {
 public:
  BatchNormSwishImpl(torch::nn::BatchNorm2d* bn, Swish* swish, std::string bn_scope, std::string swish_scope);
  virtual at::Tensor forward(const at::Tensor& x);
  torch::nn::BatchNorm2d* bn;
  Swish* swish;
  std::string bn_scope, swish_scope;
};
TORCH_MODULE(BatchNormSwish);

// The squeeze-and-excitation tail, sigmoid(gate) · x.
class SqueezeExcitationGateImpl : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& gate);
};
TORCH_MODULE(SqueezeExcitationGate);

// A residual block's tail: the reference's drop_connect of x (in training), then + inputs.
class DropConnectAddImpl : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& inputs, double drop_connect_rate);
};
TORCH_MODULE(DropConnectAdd);

class MBConvBlockImpl : public torch::nn::Module {
 public:
  // path: the block's place in the model ("_blocks.3"), naming its profiler scopes.
  MBConvBlockImpl(const BlockArgs& args, const GlobalParams& p, int image_size, const std::string& swish,
                  const std::string& path);
  at::Tensor forward(const at::Tensor& inputs, double drop_connect_rate);
  at::Tensor squeeze_excite(const at::Tensor& x);
  bool has_residual() const;  // stride 1, as many filters out as in, and not "noskip"
  BlockArgs args;
  struct ScopeNames {
    std::string block, expand_conv, depthwise_conv, se, swish, project_conv, bn2;
  } scope;
  Conv2dStaticSamePadding _expand_conv{nullptr}, _depthwise_conv{nullptr}, _se_reduce{nullptr},
      _se_expand{nullptr}, _project_conv{nullptr};
  torch::nn::BatchNorm2d _bn0{nullptr}, _bn1{nullptr}, _bn2{nullptr};
  Swish _swish{nullptr};
  // The fusion points beside the reference's own modules (none where the block has no such step).
  BatchNormSwish _bn0_swish{nullptr}, _bn1_swish{nullptr};
  SqueezeExcitationGate _se_gate{nullptr};
  DropConnectAdd _drop_connect_add{nullptr};
};
TORCH_MODULE(MBConvBlock);

class EfficientNetImpl : public torch::nn::Module {
 public:
  EfficientNetImpl(const std::vector<BlockArgs>& blocks, const GlobalParams& p, const std::string& swish);
  at::Tensor forward(const at::Tensor& x);
  int64_t parameter_count() const;
  std::vector<MBConvBlockImpl*> blocks() const;
  GlobalParams params;
  Conv2dStaticSamePadding _conv_stem{nullptr}, _conv_head{nullptr};
  torch::nn::BatchNorm2d _bn0{nullptr}, _bn1{nullptr};
  torch::nn::ModuleList _blocks;
  torch::nn::Dropout _dropout{nullptr};
  torch::nn::Linear _fc{nullptr};
  Swish _swish{nullptr};
  BatchNormSwish _bn0_swish{nullptr}, _bn1_swish{nullptr};  // the stem's and the head's
};
TORCH_MODULE(EfficientNet);

// The B0 block strings; every variant scales them.
const std::vector<std::string>& efficientnet_block_strings();

// Builds efficientnet-bN; image_size 0 means the variant's own resolution.
EfficientNet make_efficientnet(const std::string& model_name, int num_classes = 1000, int image_size = 0,
                               const std::string& swish = "memory-efficient");

}  // namespace opfuse::models
