// EfficientNet as the reference builds it (lukemelas/efficientnet_pytorch, model.py/utils.py).
#include "opfuse/efficientnet.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <regex>
#include <stdexcept>

#include "opfuse/profile.h"
#include "opfuse/reference_ops.h"

namespace opfuse::models {
namespace {

int output_image_size(int image_size, int stride) {
  return static_cast<int>(std::ceil(static_cast<double>(image_size) / stride));
}

// The reference's drop_connect: keep each sample with probability 1 − p and rescale.
at::Tensor reference_drop_connect(const at::Tensor& inputs, double p, bool training) {
  if (!training) return inputs;
  const double keep = 1.0 - p;
  at::Tensor random = keep + torch::rand({inputs.size(0), 1, 1, 1}, inputs.options());
  return inputs / keep * torch::floor(random);
}

torch::nn::BatchNorm2d batch_norm(int channels, const GlobalParams& p) {
  return torch::nn::BatchNorm2d(
      torch::nn::BatchNorm2dOptions(channels).momentum(p.batch_norm_momentum).eps(p.batch_norm_epsilon));
}

}  // namespace

const std::vector<std::string>& swish_spellings() {
  static const std::vector<std::string> names{"memory-efficient", "composite", "aten"};
  return names;
}

void check_swish_spelling(const std::string& spelling) {
  const auto& names = swish_spellings();
  if (std::find(names.begin(), names.end(), spelling) == names.end())
    throw std::invalid_argument(fmt::format("unknown swish '{}' (expected {})", spelling, fmt::join(names, ", ")));
}

BlockArgs decode_block_string(const std::string& block) {
  static const std::regex part("([a-z]+)([0-9.]+)");
  BlockArgs a;
  std::map<std::string, std::string> options;
  for (auto it = std::sregex_iterator(block.begin(), block.end(), part); it != std::sregex_iterator(); ++it)
    options[(*it)[1]] = (*it)[2];
  for (const char* key : {"r", "k", "s", "e", "i", "o"})
    if (!options.count(key)) throw std::invalid_argument(fmt::format("block string '{}' has no '{}' field", block, key));
  const std::string& s = options["s"];
  // "s22" is a 2×2 stride; the reference keeps a square stride only.
  if (s.size() == 2 && s[0] != s[1]) throw std::invalid_argument(fmt::format("block string '{}': non-square stride", block));
  a.num_repeat = std::stoi(options["r"]);
  a.kernel_size = std::stoi(options["k"]);
  a.stride = s[0] - '0';
  a.expand_ratio = std::stoi(options["e"]);
  a.input_filters = std::stoi(options["i"]);
  a.output_filters = std::stoi(options["o"]);
  a.se_ratio = options.count("se") ? std::stod(options["se"]) : 0.0;
  a.id_skip = block.find("noskip") == std::string::npos;
  return a;
}

const std::vector<std::string>& efficientnet_block_strings() {
  static const std::vector<std::string> blocks{
      "r1_k3_s11_e1_i32_o16_se0.25", "r2_k3_s22_e6_i16_o24_se0.25", "r2_k5_s22_e6_i24_o40_se0.25",
      "r3_k3_s22_e6_i40_o80_se0.25", "r3_k5_s11_e6_i80_o112_se0.25", "r4_k5_s22_e6_i112_o192_se0.25",
      "r1_k3_s11_e6_i192_o320_se0.25"};
  return blocks;
}

const std::vector<std::string>& efficientnet_names() {
  static const std::vector<std::string> names{"efficientnet-b0", "efficientnet-b1", "efficientnet-b2",
                                              "efficientnet-b3", "efficientnet-b4", "efficientnet-b5",
                                              "efficientnet-b6", "efficientnet-b7"};
  return names;
}

GlobalParams efficientnet_params(const std::string& model_name, int num_classes) {
  struct Scaling { double width, depth; int resolution; double dropout; };
  static const std::map<std::string, Scaling> table{
      {"efficientnet-b0", {1.0, 1.0, 224, 0.2}}, {"efficientnet-b1", {1.0, 1.1, 240, 0.2}},
      {"efficientnet-b2", {1.1, 1.2, 260, 0.3}}, {"efficientnet-b3", {1.2, 1.4, 300, 0.3}},
      {"efficientnet-b4", {1.4, 1.8, 380, 0.4}}, {"efficientnet-b5", {1.6, 2.2, 456, 0.4}},
      {"efficientnet-b6", {1.8, 2.6, 528, 0.5}}, {"efficientnet-b7", {2.0, 3.1, 600, 0.5}}};
  const auto it = table.find(model_name);
  if (it == table.end())
    throw std::invalid_argument(fmt::format("unknown model '{}' (expected efficientnet-b0 … efficientnet-b7)", model_name));
  GlobalParams p;
  p.width = it->second.width;
  p.depth = it->second.depth;
  p.image_size = it->second.resolution;
  p.dropout_rate = it->second.dropout;
  p.num_classes = num_classes;
  return p;
}

int round_filters(int filters, const GlobalParams& p) {
  const double f = filters * p.width;
  const int divisor = p.depth_divisor;
  int rounded = std::max(divisor, static_cast<int>(f + divisor / 2.0) / divisor * divisor);
  if (rounded < 0.9 * f) rounded += divisor;  // never round down by more than 10%
  return rounded;
}

int round_repeats(int repeats, const GlobalParams& p) {
  return static_cast<int>(std::ceil(p.depth * repeats));
}

Conv2dStaticSamePaddingImpl::Conv2dStaticSamePaddingImpl(int in, int out, int kernel, int stride, int groups,
                                                         bool with_bias, int image_size)
    : stride_(stride), groups_(groups) {
  // Initialised as torch.nn.Conv2d is (kaiming-uniform with a = √5).
  torch::nn::Conv2d init(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).groups(groups).bias(with_bias));
  weight = register_parameter("weight", init->weight.detach().clone());
  if (with_bias) bias = register_parameter("bias", init->bias.detach().clone());
  const int out_size = output_image_size(image_size, stride);
  const int pad = std::max((out_size - 1) * stride + kernel - image_size, 0);
  padding_ = {pad / 2, pad - pad / 2, pad / 2, pad - pad / 2};
}

at::Tensor Conv2dStaticSamePaddingImpl::forward(const at::Tensor& x) {
  const bool padded = padding_[1] > 0;
  const at::Tensor input = padded ? torch::constant_pad_nd(x, padding_, 0) : x;
  return torch::conv2d(input, weight, bias, at::IntArrayRef{stride_, stride_}, at::IntArrayRef{0, 0},
                       at::IntArrayRef{1, 1}, groups_);
}

SwishImpl::SwishImpl(std::string spelling_) : spelling(std::move(spelling_)) { check_swish_spelling(spelling); }

at::Tensor SwishImpl::forward(const at::Tensor& x) {
  if (spelling == "composite") return reference::composite_swish(x);
  if (spelling == "aten") return torch::silu(x);
  return reference::memory_efficient_swish(x);
}

// Each submodule call runs inside a profiler scope named by its path (free when no profiler runs).
template <typename F>
at::Tensor in_scope(const std::string& name, F&& f) {
  profile::Scope scope(name);
  return f();
}

BatchNormSwishImpl::BatchNormSwishImpl(torch::nn::BatchNorm2d* bn_, Swish* swish_, std::string bn_scope_,
                                       std::string swish_scope_)
    : bn(bn_), swish(swish_), bn_scope(std::move(bn_scope_)), swish_scope(std::move(swish_scope_)) {}

at::Tensor BatchNormSwishImpl::forward(const at::Tensor& x) {
  const at::Tensor y = in_scope(bn_scope, [&] { return (*bn)->forward(x); });
  return in_scope(swish_scope, [&] { return (*swish)->forward(y); });
}

at::Tensor SqueezeExcitationGateImpl::forward(const at::Tensor& x, const at::Tensor& gate) {
  return reference::composite_se_gate(x, gate);
}

at::Tensor DropConnectAddImpl::forward(const at::Tensor& x, const at::Tensor& inputs, double drop_connect_rate) {
  if (drop_connect_rate == 0) return x + inputs;
  return reference_drop_connect(x, drop_connect_rate, is_training()) + inputs;
}

MBConvBlockImpl::MBConvBlockImpl(const BlockArgs& a, const GlobalParams& p, int image_size, const std::string& swish,
                                 const std::string& path)
    : args(a),
      scope{path, path + "._expand_conv", path + "._depthwise_conv", path + ".squeeze_excitation",
            path + "._swish", path + "._project_conv", path + "._bn2"} {
  const int inp = a.input_filters, oup = a.input_filters * a.expand_ratio;
  if (a.expand_ratio != 1) {
    _expand_conv = register_module("_expand_conv", Conv2dStaticSamePadding(inp, oup, 1, 1, 1, false, image_size));
    _bn0 = register_module("_bn0", batch_norm(oup, p));
    _bn0_swish = register_module("_bn0_swish", BatchNormSwish(&_bn0, &_swish, path + "._bn0", scope.swish));
  }
  _depthwise_conv = register_module(
      "_depthwise_conv", Conv2dStaticSamePadding(oup, oup, a.kernel_size, a.stride, oup, false, image_size));
  _bn1 = register_module("_bn1", batch_norm(oup, p));
  _bn1_swish = register_module("_bn1_swish", BatchNormSwish(&_bn1, &_swish, path + "._bn1", scope.swish));
  if (a.se_ratio > 0 && a.se_ratio <= 1) {
    const int squeezed = std::max(1, static_cast<int>(a.input_filters * a.se_ratio));
    _se_reduce = register_module("_se_reduce", Conv2dStaticSamePadding(oup, squeezed, 1, 1, 1, true, 1));
    _se_expand = register_module("_se_expand", Conv2dStaticSamePadding(squeezed, oup, 1, 1, 1, true, 1));
    _se_gate = register_module("_se_gate", SqueezeExcitationGate());
  }
  _project_conv = register_module("_project_conv", Conv2dStaticSamePadding(oup, a.output_filters, 1, 1, 1, false, image_size));
  _bn2 = register_module("_bn2", batch_norm(a.output_filters, p));
  _swish = register_module("_swish", Swish(swish));
  if (has_residual()) _drop_connect_add = register_module("_drop_connect_add", DropConnectAdd());
}

bool MBConvBlockImpl::has_residual() const {
  return args.id_skip && args.stride == 1 && args.input_filters == args.output_filters;
}

at::Tensor MBConvBlockImpl::squeeze_excite(const at::Tensor& x) {
  profile::Scope se(scope.se);
  at::Tensor squeezed = torch::adaptive_avg_pool2d(x, {1, 1});
  squeezed = _se_reduce->forward(squeezed);
  squeezed = in_scope(scope.swish, [&] { return _swish->forward(squeezed); });
  squeezed = _se_expand->forward(squeezed);
  return _se_gate->forward(x, squeezed);
}

at::Tensor MBConvBlockImpl::forward(const at::Tensor& inputs, double drop_connect_rate) {
  profile::Scope block(scope.block);
  at::Tensor x = inputs;
  if (_expand_conv) {
    x = in_scope(scope.expand_conv, [&] { return _expand_conv->forward(x); });
    x = _bn0_swish->forward(x);
  }
  x = in_scope(scope.depthwise_conv, [&] { return _depthwise_conv->forward(x); });
  x = _bn1_swish->forward(x);
  if (_se_reduce) x = squeeze_excite(x);
  x = in_scope(scope.project_conv, [&] { return _project_conv->forward(x); });
  x = in_scope(scope.bn2, [&] { return _bn2->forward(x); });
  return _drop_connect_add ? _drop_connect_add->forward(x, inputs, drop_connect_rate) : x;
}

EfficientNetImpl::EfficientNetImpl(const std::vector<BlockArgs>& blocks, const GlobalParams& p, const std::string& swish)
    : params(p) {
  int image_size = p.image_size;
  const int stem_out = round_filters(32, p);
  _conv_stem = register_module("_conv_stem", Conv2dStaticSamePadding(3, stem_out, 3, 2, 1, false, image_size));
  _bn0 = register_module("_bn0", batch_norm(stem_out, p));
  image_size = output_image_size(image_size, 2);

  _blocks = register_module("_blocks", torch::nn::ModuleList());
  for (BlockArgs a : blocks) {
    a.input_filters = round_filters(a.input_filters, p);
    a.output_filters = round_filters(a.output_filters, p);
    a.num_repeat = round_repeats(a.num_repeat, p);
    for (int r = 0; r < a.num_repeat; ++r) {
      _blocks->push_back(MBConvBlock(a, p, image_size, swish, "_blocks." + std::to_string(_blocks->size())));
      if (r == 0) image_size = output_image_size(image_size, a.stride);
      a.input_filters = a.output_filters;
      a.stride = 1;
    }
  }

  const int head_in = blocks.empty() ? stem_out : round_filters(blocks.back().output_filters, p);
  const int head_out = round_filters(1280, p);
  _conv_head = register_module("_conv_head", Conv2dStaticSamePadding(head_in, head_out, 1, 1, 1, false, image_size));
  _bn1 = register_module("_bn1", batch_norm(head_out, p));
  _dropout = register_module("_dropout", torch::nn::Dropout(p.dropout_rate));
  _fc = register_module("_fc", torch::nn::Linear(head_out, p.num_classes));
  _swish = register_module("_swish", Swish(swish));
  _bn0_swish = register_module("_bn0_swish", BatchNormSwish(&_bn0, &_swish, "_bn0", "_swish"));
  _bn1_swish = register_module("_bn1_swish", BatchNormSwish(&_bn1, &_swish, "_bn1", "_swish"));
}

at::Tensor EfficientNetImpl::forward(const at::Tensor& input) {
  at::Tensor x = in_scope("_conv_stem", [&] { return _conv_stem->forward(input); });
  x = _bn0_swish->forward(x);
  const size_t n = _blocks->size();
  for (size_t i = 0; i < n; ++i) {
    const double rate = params.drop_connect_rate * static_cast<double>(i) / n;
    x = _blocks[i]->as<MBConvBlock>()->forward(x, rate);
  }
  x = in_scope("_conv_head", [&] { return _conv_head->forward(x); });
  x = _bn1_swish->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return in_scope("_fc", [&] { return _fc->forward(_dropout->forward(x)); });
}

std::vector<MBConvBlockImpl*> EfficientNetImpl::blocks() const {
  std::vector<MBConvBlockImpl*> out;
  for (const auto& m : *_blocks) out.push_back(m->as<MBConvBlock>());
  return out;
}

int64_t EfficientNetImpl::parameter_count() const {
  int64_t total = 0;
  for (const auto& p : parameters()) total += p.numel();
  return total;
}

EfficientNet make_efficientnet(const std::string& model_name, int num_classes, int image_size, const std::string& swish) {
  GlobalParams p = efficientnet_params(model_name, num_classes);
  if (image_size > 0) p.image_size = image_size;
  std::vector<BlockArgs> blocks;
  for (const auto& s : efficientnet_block_strings()) blocks.push_back(decode_block_string(s));
  return EfficientNet(blocks, p, swish);
}

}  // namespace opfuse::models
