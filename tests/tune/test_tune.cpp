// tune: verification, rewrites on EfficientNet and on TorchScript modules, and the loop end to end
// on a tiny configuration.
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "opfuse/rewrite.h"
#include "opfuse/tune.h"
#include "tune/session.h"

namespace opfuse::tune {
namespace {

TuneOptions tiny(int image_size = 64, int batch = 4) {
  TuneOptions o;
  o.image_size = image_size;
  o.batch_size = batch;
  o.num_classes = 10;
  o.seed = static_cast<uint64_t>(std::random_device{}());
  return o;
}

const analyze::Rule& rule(const std::vector<analyze::Rule>& rules, const std::string& name) {
  for (const auto& r : rules)
    if (r.name == name) return r;
  throw std::runtime_error("no rule " + name);
}

TEST(Verify, AnUnchangedModelHasNoError) {
  const TuneOptions o = tiny();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  auto model = rewrite::efficientnet("efficientnet-b0", o.image_size, o.num_classes, o.seed);
  const Batches b = make_batches(o, *model);
  const Verdict v = verify(*model, *model, b, o.seed);
  EXPECT_TRUE(v.passed) << v.error;
  EXPECT_EQ(v.float32_error, 0);
  EXPECT_EQ(v.float64_error, 0);
}

TEST(Verify, FusedSwishAndGateAgreeWithTheReference) {
  const TuneOptions o = tiny();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  auto model = rewrite::efficientnet("efficientnet-b0", o.image_size, o.num_classes, o.seed);
  const Batches b = make_batches(o, *model);
  const auto rules = analyze::default_rules();
  for (const char* name : {"silu", "se_gate"}) {
    auto candidate = model->clone();
    const auto rewrites = rewrite::rewrites_for(rule(rules, name));
    ASSERT_FALSE(rewrites.empty());
    EXPECT_GT(rewrites.front().apply(*candidate), 0);
    const Verdict v = verify(*model, *candidate, b, o.seed);
    std::printf("%s: float32 %.3g float64 %.3g (worst: %s)\n", name, v.float32_error, v.float64_error, v.worst.c_str());
    EXPECT_TRUE(v.passed) << name << ": " << rejection(v);
  }
}

}  // namespace
}  // namespace opfuse::tune
