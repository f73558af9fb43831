// The two kinds of rewrite::Model (models.cpp), seen by the rewrites that need their insides.
#pragma once

#include <torch/csrc/jit/api/module.h>

#include "opfuse/efficientnet.h"
#include "opfuse/rewrite.h"

namespace opfuse::rewrite {

class EfficientNetModel : public Model {
 public:
  EfficientNetModel(std::string name, int image_size, int num_classes);
  std::string name() const override { return name_; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override { return net->forward(inputs.at(0)); }
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;
  void set_training(bool on) override { net->train(on); }
  void to(at::ScalarType dtype) override { net->to(dtype); }
  std::unique_ptr<Model> clone() const override;
  std::vector<std::string> save(const std::string& path_without_extension) const override;
  std::string describe() const override;

  models::EfficientNet net{nullptr};
  models::SwishKind swish = models::SwishKind::memory_efficient;
  models::SeGateKind se_gate = models::SeGateKind::composite;
  models::BatchNormSiluKind bn_silu = models::BatchNormSiluKind::composite;
  models::DropConnectKind drop_connect = models::DropConnectKind::composite;
  void apply_kinds();  // sets the model's switches from the fields above

 private:
  std::string name_;
  int image_size_, num_classes_;
};

class TorchScriptModel : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, std::string name);
  std::string name() const override { return name_; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;
  void set_training(bool on) override { module.train(on); }
  void pass_dropout() override;
  void to(at::ScalarType dtype) override { module.to(dtype); }
  std::unique_ptr<Model> clone() const override;
  std::vector<std::string> save(const std::string& path_without_extension) const override;
  std::string describe() const override;

  torch::jit::Module module;
  std::vector<std::string> applied;  // the rewrites applied, for describe()

 private:
  std::string name_;
};

}  // namespace opfuse::rewrite
