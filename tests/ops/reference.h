// Shared helpers for the operator tests: fresh random data and elementwise comparison
// against a float64 reference with an explicit per-element tolerance.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/capability.h"

namespace opfuse::testing {

// Seeds torch from the OS so every run sees new data; the seed is logged on failure, and
// OPFUSE_TEST_SEED=N replays it.
inline uint64_t fresh_seed() {
  const char* replay = std::getenv("OPFUSE_TEST_SEED");
  const uint64_t seed = replay != nullptr ? std::stoull(replay) : std::random_device{}();
  torch::manual_seed(seed);
  return seed;
}

// Asserts |actual − reference| ≤ tolerance elementwise (NaN must meet NaN), reporting the
// worst element. reference and tolerance are float64.
inline void expect_close(const at::Tensor& actual, const at::Tensor& reference, const at::Tensor& tolerance,
                         const std::string& what) {
  ASSERT_EQ(actual.sizes(), reference.sizes()) << what;
  const at::Tensor a = actual.to(torch::kDouble).reshape({-1});
  const at::Tensor r = reference.reshape({-1});
  const at::Tensor t = tolerance.expand_as(reference).reshape({-1});
  const at::Tensor nan_mismatch = a.isnan() != r.isnan();
  EXPECT_EQ(nan_mismatch.sum().item<int64_t>(), 0) << what << ": NaN where the reference has none, or vice versa";
  const at::Tensor both_finite = a.isfinite() & r.isfinite();
  const at::Tensor inf_mismatch = (~both_finite) & (~a.isnan()) & (a != r);
  EXPECT_EQ(inf_mismatch.sum().item<int64_t>(), 0) << what << ": infinities differ";
  const at::Tensor excess = torch::where(both_finite, (a - r).abs() - t, torch::zeros_like(a));
  if (excess.numel() == 0) return;
  const int64_t worst = excess.argmax().item<int64_t>();
  EXPECT_LE(excess[worst].item<double>(), 0.0)
      << what << ": element " << worst << " is " << a[worst].item<double>() << ", reference "
      << r[worst].item<double>() << ", tolerance " << t[worst].item<double>();
}

// The message of the c10::Error f throws, without its backtrace; empty when it throws none.
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return {};
}

// The unit roundoff of the arithmetic a dtype's kernels run in (bfloat16 in float), and of its
// storage (bfloat16's 2^-8; 0 where arithmetic and storage agree).
inline double unit_roundoff(at::ScalarType t) { return t == torch::kDouble ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24); }
inline double storage_roundoff(at::ScalarType t) { return t == torch::kBFloat16 ? std::ldexp(1.0, -8) : 0; }

// A fused optimizer's parameter group in miniature: matrices, a norm's vector, one tensor of
// several pieces, sizes not a multiple of any vector width, and an empty one.
inline const std::vector<std::vector<int64_t>> kParameterShapes{{37, 5}, {40000}, {3}, {64, 48}, {0}, {16, 1}};

// That f throws a c10::Error whose message (without its backtrace) holds `fragment`.
inline void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

// Runs the test body on each CPU path this machine has.
inline std::vector<cpu::Capability> capabilities() {
  std::vector<cpu::Capability> caps;
  for (auto c : {cpu::Capability::scalar, cpu::Capability::avx2, cpu::Capability::avx512})
    if (c <= cpu::best_cpu_capability()) caps.push_back(c);
  return caps;
}

struct CapabilityScope {
  explicit CapabilityScope(cpu::Capability c) : saved(cpu::cpu_capability()) { cpu::set_cpu_capability(c); }
  ~CapabilityScope() { cpu::set_cpu_capability(saved); }
  cpu::Capability saved;
};

struct ThreadScope {
  explicit ThreadScope(int n) : saved(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadScope() { at::set_num_threads(saved); }
  int saved;
};

// A test run on every CPU path this machine has and every supported dtype:
//   class FooTest : public PathAndDtypeTest {};
//   INSTANTIATE_TEST_SUITE_P(Ops, FooTest, every_path_and_dtype(), path_and_dtype_name);
using PathAndDtypeTest = ::testing::TestWithParam<std::tuple<cpu::Capability, at::ScalarType>>;

inline auto every_path_and_dtype() {
  return ::testing::Combine(::testing::ValuesIn(capabilities()),
                            ::testing::Values(torch::kFloat, torch::kDouble, torch::kBFloat16));
}

inline std::string path_and_dtype_name(const ::testing::TestParamInfo<PathAndDtypeTest::ParamType>& info) {
  const auto [cap, dtype] = info.param;
  return std::string(cpu::capability_name(cap)) + "_" + c10::toString(dtype);
}

}  // namespace opfuse::testing
