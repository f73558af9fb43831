// opfuse::optim::AdamW and SGD against torch::optim's: the same trajectory in float64 (to 1e-12
// after 10 steps: each step is torch's arithmetic to rounding), archives of either load in the
// other, AdamW's amsgrad refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "opfuse/optim.h"
#include "reference.h"

namespace opfuse::testing {
namespace {

using torch::optim::AdamWOptions;

torch::nn::Sequential small_model() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  model->to(torch::kDouble);
  return model;
}

// Matrices with the first options, biases with the second (decayed and not, as a Llama recipe
// groups them).
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> groups_of(torch::nn::Sequential& model, const Options& matrix_options,
                                                         const Options& vector_options) {
  std::vector<at::Tensor> matrices, vectors;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? matrices : vectors).push_back(p);
  using Group = torch::optim::OptimizerParamGroup;
  return {Group(matrices, std::make_unique<Options>(matrix_options)),
          Group(vectors, std::make_unique<Options>(vector_options))};
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(torch::nn::Sequential& model) {
  return groups_of(model, AdamWOptions(1e-2).weight_decay(0.1), AdamWOptions(3e-2).weight_decay(0));
}

// Momentum and decay on the matrices, Nesterov on the biases.
std::vector<torch::optim::OptimizerParamGroup> sgd_groups_of(torch::nn::Sequential& model) {
  using torch::optim::SGDOptions;
  return groups_of(model, SGDOptions(5e-2).momentum(0.9).dampening(0.1).weight_decay(1e-2),
                   SGDOptions(2e-2).momentum(0.8).nesterov(true));
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int i = 0; i < steps; ++i) {
    const at::Tensor x = at::randn({16, 8}, gen, torch::kDouble);
    optimizer.zero_grad();
    model->forward(x).pow(2).mean().backward();
    optimizer.step();
  }
}

double max_difference(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  double worst = 0;
  const auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  return worst;
}

TEST(OptimAdamW, TracksTorchAdamWOverTenSteps) {
  auto ours = small_model(), theirs = small_model(), start = small_model();
  opfuse::optim::AdamW a(groups_of(ours));
  torch::optim::AdamW b(groups_of(theirs));
  train(ours, a, 10, 1);
  train(theirs, b, 10, 1);
  EXPECT_GT(max_difference(ours, start), 1e-2) << "the parameters moved";
  EXPECT_LE(max_difference(ours, theirs), 1e-12);
}

template <typename First, typename Then, typename Options = AdamWOptions>
void check_resume(std::vector<torch::optim::OptimizerParamGroup> (*groups)(torch::nn::Sequential&) = groups_of,
                  const Options& defaults = {}) {
  auto model = small_model();
  First first(groups(model), defaults);
  train(model, first, 3, 4);
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    first.save(archive);
    archive.save_to(stream);
  }
  auto resumed_model = small_model();
  for (size_t i = 0; i < model->parameters().size(); ++i)
    resumed_model->parameters()[i].detach().copy_(model->parameters()[i].detach());
  Then resumed(groups(resumed_model), defaults);
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  resumed.load(archive);
  train(model, first, 3, 5);
  train(resumed_model, resumed, 3, 5);
  EXPECT_LE(max_difference(model, resumed_model), 1e-12);
}

TEST(OptimAdamW, AnArchiveOfEitherContinuesInTheOther) {
  check_resume<opfuse::optim::AdamW, torch::optim::AdamW>();
  check_resume<torch::optim::AdamW, opfuse::optim::AdamW>();
}

TEST(OptimSgd, TracksTorchSgdOverTenSteps) {
  auto ours = small_model(), theirs = small_model(), start = small_model();
  opfuse::optim::SGD a(sgd_groups_of(ours), torch::optim::SGDOptions(1e-2));
  torch::optim::SGD b(sgd_groups_of(theirs), torch::optim::SGDOptions(1e-2));
  train(ours, a, 10, 1);
  train(theirs, b, 10, 1);
  EXPECT_GT(max_difference(ours, start), 1e-2) << "the parameters moved";
  EXPECT_LE(max_difference(ours, theirs), 1e-12);
  // no momentum: no buffers kept
  auto plain = small_model(), plain_torch = small_model();
  opfuse::optim::SGD c(plain->parameters(), torch::optim::SGDOptions(0.1).weight_decay(1e-3));
  torch::optim::SGD d(plain_torch->parameters(), torch::optim::SGDOptions(0.1).weight_decay(1e-3));
  train(plain, c, 10, 2);
  train(plain_torch, d, 10, 2);
  EXPECT_LE(max_difference(plain, plain_torch), 1e-12);
  EXPECT_TRUE(c.state().empty());
}

TEST(OptimSgd, ATensorListedTwiceIsSteppedAsTorchStepsIt) {
  const at::Tensor start = torch::randn({7}, torch::kDouble), grad = torch::randn({7}, torch::kDouble);
  std::vector<at::Tensor> after;
  for (bool ours : {true, false}) {
    at::Tensor p = start.clone().requires_grad_();
    const torch::optim::SGDOptions options = torch::optim::SGDOptions(0.1).momentum(0.9);
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (ours) optimizer = std::make_unique<opfuse::optim::SGD>(std::vector<at::Tensor>{p, p}, options);
    else optimizer = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{p, p}, options);
    for (int step = 0; step < 3; ++step) {
      p.mutable_grad() = grad.clone();
      optimizer->step();
    }
    after.push_back(p.detach());
  }
  EXPECT_LE((after[0] - after[1]).abs().max().item<double>(), 1e-15);
}

TEST(OptimSgd, AnArchiveOfEitherContinuesInTheOther) {
  check_resume<opfuse::optim::SGD, torch::optim::SGD>(sgd_groups_of, torch::optim::SGDOptions(1e-2));
  check_resume<torch::optim::SGD, opfuse::optim::SGD>(sgd_groups_of, torch::optim::SGDOptions(1e-2));
}

TEST(OptimAdamW, RefusesAmsgrad) {
  auto model = small_model();
  EXPECT_THROW(opfuse::optim::AdamW(model->parameters(), AdamWOptions().amsgrad(true)), c10::Error);
}

}  // namespace
}  // namespace opfuse::testing
