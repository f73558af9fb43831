// Every op in the OpSpec table, on fresh random data at each of its sample shapes, in float64:
// the opfuse variant against the composite it replaces, forward and the gradient of every leaf
// (an optimizer: the parameters after one step). Each variant runs on its own copy of the case
// (made twice from one seed) and from one seed, so a random mask is drawn alike.
//
// Stated bound, per element: |opfuse − reference| ≤ 1e-10·(|ref| + max|ref|), float64's 2^-53
// grown by sums of at most a few hundred terms and by cancellation against the tensor's largest
// value (dx = g·r − x·r³·c/d and the like). Each op's own test states its tighter bounds and
// covers bfloat16, float32 and every CPU path.
#include <algorithm>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "opfuse/op_spec.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_op_specs {
namespace {

constexpr size_t kReference = 0, kOpfuse = 2;

// The forward's output and each leaf's gradient, or for a step the leaves' new values.
std::vector<at::Tensor> run(const OpCase& c, size_t variant, uint64_t seed) {
  torch::manual_seed(seed);
  const OpVariant& v = c.variants.at(variant);
  std::vector<at::Tensor> results;
  if (v.step) {
    v.step();
    for (const at::Tensor& leaf : c.leaves) results.push_back(leaf.detach().clone());
    return results;
  }
  const at::Tensor y = v.forward();
  y.backward(c.grad_output);
  results.push_back(y.detach());
  for (const at::Tensor& leaf : c.leaves) results.push_back(leaf.grad());
  return results;
}

// tol·(|ref| + max|ref|), elementwise: the bound of these tests, relative to the element and to
// the tensor's largest (cancellation against it).
at::Tensor scaled_tolerance(const at::Tensor& ref, double tol) {
  const double largest = ref.numel() == 0 ? 0 : ref.abs().max().item<double>();
  return tol * (ref.abs() + largest);
}

std::string describe(const OpSpec& spec, const InputShapes& shapes) {
  std::string s = spec.name;
  for (const auto& shape : shapes) s.append(" ").append(c10::str(at::IntArrayRef(shape)));
  return s;
}

TEST(OpSpecs, EveryOpMatchesItsCompositeInFloat64OnFreshData) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_FALSE(op_specs().empty());
  for (const OpSpec& spec : op_specs()) {
    ASSERT_FALSE(spec.samples.empty()) << spec.name << " has no sample shapes";
    for (const InputShapes& shapes : spec.samples) {
      const std::string what = describe(spec, shapes);
      OpArgs args{shapes, torch::kDouble};
      torch::manual_seed(seed);
      const OpCase reference_case = spec.make(args);
      torch::manual_seed(seed);
      const OpCase fused_case = spec.make(args);
      ASSERT_EQ(fused_case.variants.size(), 3u) << what;
      EXPECT_EQ(fused_case.variants[kReference].name, "reference") << what;
      EXPECT_EQ(fused_case.variants[kOpfuse].name, "opfuse") << what;
      const auto expected = run(reference_case, kReference, seed + 1);
      const auto actual = run(fused_case, kOpfuse, seed + 1);
      ASSERT_EQ(actual.size(), expected.size()) << what;
      // An item the reference makes exactly zero (dq and dk of attention over one key: the softmax
      // of a single score is 1 whatever it is) is computed by the fused op as a difference that
      // rounds (dP − rowsum(dO·O)), so it is bounded relative to the case's largest value.
      double case_largest = 0;
      for (const auto& e : expected)
        if (e.defined() && e.numel() > 0) case_largest = std::max(case_largest, e.to(torch::kDouble).abs().max().item<double>());
      for (size_t i = 0; i < actual.size(); ++i) {
        const std::string item = what + (i == 0 && !fused_case.variants[kOpfuse].step ? " output" : " leaf " + std::to_string(i));
        ASSERT_EQ(actual[i].defined(), expected[i].defined()) << item;
        if (!expected[i].defined()) continue;
        ASSERT_EQ(actual[i].scalar_type(), torch::kDouble) << item;
        const at::Tensor ref = expected[i].to(torch::kDouble);
        const bool all_zero = ref.numel() > 0 && ref.abs().max().item<double>() == 0;
        expect_close(actual[i], ref,
                     all_zero ? torch::full_like(ref, 1e-10 * case_largest) : scaled_tolerance(ref, 1e-10), item);
      }
    }
  }
}

// bench-op's shapes, made small (--numel 1000, or the op's default where it refuses --numel).
InputShapes small_bench_shapes(const OpSpec& spec) {
  try {
    return spec.bench_shapes({1000, 9, 8});
  } catch (const std::invalid_argument&) {
    return spec.bench_shapes({0, 9, 8});
  }
}

// The case in float64 whose inputs hold dtype's values: made from the same seed (the specs draw
// in float, then convert), its leaves and grad_output rounded to dtype in place, where the
// variants' closures see them.
OpCase float64_case_with_values_of(const OpSpec& spec, const InputShapes& shapes, at::ScalarType dtype,
                                   uint64_t seed) {
  torch::manual_seed(seed);
  OpCase c = spec.make({shapes, torch::kDouble});
  torch::NoGradGuard no_grad;
  for (at::Tensor t : c.leaves) t.copy_(t.to(dtype));
  if (c.grad_output.defined()) c.grad_output.copy_(c.grad_output.to(dtype));
  return c;
}

// Whether |actual − ref| ≤ scaled_tolerance(ref, tol) everywhere (NaN where ref has NaN).
bool within(const at::Tensor& actual, const at::Tensor& ref, double tol) {
  const at::Tensor a = actual.to(torch::kDouble);
  const at::Tensor ok = ((a - ref).abs() <= scaled_tolerance(ref, tol)) | (a.isnan() & ref.isnan());
  return ok.all().item<bool>();
}

// float32 and bfloat16 at bench-op's (Llama-like) shapes: the opfuse variant against the
// composite it replaces on the same inputs, in float64 or in that dtype. Bound, per element, of
// (|ref| + max|ref|): float32 1e-5, its 2^-24 grown by sums of a few hundred terms on either side;
// bfloat16 3.2e-2, 8 of its 2^-8 roundings, as a composite rounds each of its up to 8 steps to
// bfloat16. Either reference will do: the float64 one is the exact answer, but a case that draws
// inside a variant (drop_connect_add's mask) draws anew in float64; the dtype's composite draws
// the same, but its reductions in bfloat16 can stray further than 8 roundings (batch_norm_silu's
// dweight, a sum of 50,176 terms, was 10 % off where the fused op was within 0.2 %). (The odd
// sample shapes are float64's: a one-column RMSNorm's gradient is all cancellation, which only
// each op's own test, scaled by the terms, can bound in float32.)
TEST(OpSpecs, EveryOpMatchesItsCompositeInFloat32AndBfloat16) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const auto& [dtype, tol] : {std::pair{torch::kFloat, 1e-5}, std::pair{torch::kBFloat16, 3.2e-2}})
    for (const OpSpec& spec : op_specs()) {
      const InputShapes shapes = small_bench_shapes(spec);
      const std::string what = describe(spec, shapes) + " " + c10::toString(dtype);
      OpArgs args{shapes, dtype};
      torch::manual_seed(seed);
      const OpCase reference_case = spec.make(args);
      torch::manual_seed(seed);
      const OpCase fused_case = spec.make(args);
      const auto expected = run(reference_case, kReference, seed + 1);
      const auto exact = run(float64_case_with_values_of(spec, shapes, dtype, seed), kReference, seed + 1);
      const auto actual = run(fused_case, kOpfuse, seed + 1);
      ASSERT_EQ(actual.size(), expected.size()) << what;
      ASSERT_EQ(exact.size(), expected.size()) << what;
      for (size_t i = 0; i < actual.size(); ++i) {
        ASSERT_EQ(actual[i].defined(), expected[i].defined()) << what << " item " << i;
        if (!expected[i].defined()) continue;
        if (within(actual[i], exact[i].to(torch::kDouble), tol)) continue;
        const at::Tensor ref = expected[i].to(torch::kDouble);
        const std::string item = what + " item " + std::to_string(i) + " (nor within the float64 reference)";
        expect_close(actual[i].to(torch::kDouble), ref, scaled_tolerance(ref, tol), item);
      }
    }
}

// A trace's recorded layout is timed as recorded (analyze's estimates): channels-last
// activations, attention's heads transposed out of [B, T, H, D]. The case's activations and the
// gradient take the order asked, and the opfuse op still agrees with its reference in float64.
TEST(OpSpecs, ARecordedLayoutReachesTheActivations) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<int64_t> channels_last{0, 2, 3, 1}, heads_transposed{0, 2, 1, 3};
  for (const auto& [name, order] : {std::pair<const char*, std::vector<int64_t>>{"silu", channels_last},
                                    {"batch_norm_silu", channels_last},
                                    {"se_gate", channels_last},
                                    {"drop_connect_add", channels_last},
                                    {"attention", heads_transposed}}) {
    OpArgs args{{{2, 8, 5, 3}}, at::kDouble};
    args.dim_order = order;
    const OpSpec* spec = find_op_spec(name);
    ASSERT_NE(spec, nullptr) << name;
    const auto made = [&] {
      torch::manual_seed(seed);
      return spec->make(args);
    };
    const OpCase ref_case = made(), fused_case = made();
    for (const at::Tensor& t : {ref_case.leaves[0], ref_case.grad_output}) {
      EXPECT_FALSE(t.is_contiguous()) << name;
      EXPECT_TRUE(t.permute(order).is_contiguous()) << name << " " << t.strides();
    }
    const auto ref = run(ref_case, kReference, seed + 1), actual = run(fused_case, kOpfuse, seed + 1);
    for (size_t i = 0; i < ref.size(); ++i)
      expect_close(actual[i], ref[i], scaled_tolerance(ref[i], 1e-10), std::string(name) + " item " + std::to_string(i));
  }
}

TEST(OpSpecs, BenchShapesMakeCasesOfTheirOwn) {
  // Names are unique (bench-op's NAME, a rule's measure:), and bench-op's sizes have a case with
  // three variants and the bytes it must move. (Made small: --numel 1000, or the op's default
  // where it refuses --numel.)
  std::set<std::string> names;
  for (const OpSpec& spec : op_specs()) {
    EXPECT_TRUE(names.insert(spec.name).second) << spec.name << " twice";
    EXPECT_EQ(find_op_spec(spec.name), &spec);
    const OpCase c = spec.make({small_bench_shapes(spec)});
    EXPECT_EQ(c.variants.size(), 3u) << spec.name;
    EXPECT_GT(c.bytes_per_step, 0) << spec.name;
    EXPECT_FALSE(c.leaves.empty()) << spec.name;
  }
  EXPECT_EQ(find_op_spec("gelu"), nullptr);
}

}  // namespace
}  // namespace opfuse::testing::test_op_specs
