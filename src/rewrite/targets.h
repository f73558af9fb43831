// The two kinds of rewrite::Target (targets.cpp), seen by the rewrites that need their insides.
#pragma once

#include <torch/csrc/jit/api/module.h>

#include "opfuse/efficientnet.h"
#include "opfuse/rewrite.h"

namespace opfuse::rewrite {

class EfficientNetTarget : public Target {
 public:
  EfficientNetTarget(std::string name, int image_size, int num_classes);
  std::string name() const override { return name_; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override { return net->forward(inputs.at(0)); }
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;
  void set_training(bool on) override { net->train(on); }
  void to(at::ScalarType dtype) override { net->to(dtype); }
  int to_channels_last() override;
  std::unique_ptr<Target> clone() const override;
  std::vector<std::string> save(const std::string& path_without_extension) const override;
  std::string describe() const override;

  // fuse_efficientnet on the net, remembered (for clone, save and describe) where it changed any.
  int fuse(const std::string& rule);

  models::EfficientNet net{nullptr};
  std::vector<std::string> fused;  // rules, in the order applied
  bool channels_last = false;      // its 4-d tensors moved (clone and save keep the layout)

 private:
  std::string name_;
  int image_size_, num_classes_;
};

class TorchScriptTarget : public Target {
 public:
  TorchScriptTarget(torch::jit::Module module, std::string name);
  std::string name() const override { return name_; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;
  void set_training(bool on) override { module.train(on); }
  void pass_dropout() override;
  void to(at::ScalarType dtype) override { module.to(dtype); }
  int to_channels_last() override;
  std::unique_ptr<Target> clone() const override;
  std::vector<std::string> save(const std::string& path_without_extension) const override;
  std::string describe() const override;

  torch::jit::Module module;
  std::vector<std::string> applied;  // the rewrites applied, for describe()

 private:
  std::string name_;
};

}  // namespace opfuse::rewrite
