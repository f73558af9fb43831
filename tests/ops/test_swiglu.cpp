// opfuse::swiglu (two tensors and packed) and opfuse::geglu against a float64 reference, on
// every CPU path.
//
// Stated bounds, per element, with s = sigmoid(g) and T = |dy·u|·(1 + |g|), the magnitude of
// dgate's terms (silu' crosses zero near g = −1.28, so dgate is bounded against T, not itself):
//   float32   y, dup ≤ 5e-7·|ref|     dgate ≤ 1e-6·T        (exp ≤ 2 ulp, then ≤ 3 roundings)
//   float64   y, dup ≤ 1e-14·|ref|    dgate ≤ 1e-14·T
//   bfloat16  y, dup ≤ 4e-3·|ref|     dgate ≤ 4e-3·|ref| + 1e-6·T   (float arithmetic, rounded once)
// GeGLU, a = g·σ(z), z = 2c·g·(1 + k·g²) (gelu's tanh form): z carries 3 roundings, which σ turns
// into an error of s·(1 − s)·|z|·δ in s; so y and dup are bounded as above plus that term, Z =
// |g·u|·s·(1 − s)·(1 + |z|) (|g·dy|·… for dup), and dgate against T = |dy·u|·(1 + |z|)·(1 + |g·z'|),
// z' = 2c·(1 + 3k·g²), with the bounds' terms coefficient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_swiglu {
namespace {

struct Bound {
  double rtol, terms;
};

Bound bound_for(at::ScalarType t) {
  if (t == torch::kDouble) return {1e-14, 1e-14};
  if (t == torch::kBFloat16) return {4e-3, 1e-6};
  return {5e-7, 1e-6};
}

// gate_in and up_in as given (any layout); packed: x = cat(gate, up) on the last dimension.
void check_against_reference(const at::Tensor& gate_in, const at::Tensor& up_in, bool packed, const std::string& what) {
  const at::ScalarType dtype = gate_in.scalar_type();
  at::Tensor gate = gate_in.detach().requires_grad_(), up = up_in.detach().requires_grad_();
  at::Tensor x, y;
  const at::Tensor dy = torch::randn(gate.sizes()).to(dtype);
  if (packed) {
    x = torch::cat({gate_in, up_in}, -1).requires_grad_();
    y = opfuse::swiglu(x);
  } else {
    y = opfuse::swiglu(gate, up);
  }
  y.backward(dy);
  ASSERT_EQ(y.scalar_type(), dtype);
  const int64_t d = gate.size(-1);
  const at::Tensor dgate = packed ? x.grad().narrow(-1, 0, d) : gate.grad();
  const at::Tensor dup = packed ? x.grad().narrow(-1, d, d) : up.grad();

  const at::Tensor gd = gate_in.detach().to(torch::kDouble), ud = up_in.detach().to(torch::kDouble);
  const at::Tensor dyd = dy.to(torch::kDouble), s = torch::sigmoid(gd);
  const at::Tensor y_ref = gd * s * ud;
  // The derivative written out, so the reference does not lean on ATen's silu backward.
  const at::Tensor dgate_ref = dyd * ud * s * (1 + gd * torch::sigmoid(-gd)), dup_ref = dyd * gd * s;
  const at::Tensor terms = (dyd * ud).abs() * (1 + gd.abs());

  const Bound b = bound_for(dtype);
  const double dg_rtol = dtype == torch::kBFloat16 ? b.rtol : 0;
  expect_close(y, y_ref, b.rtol * y_ref.abs() + 1e-37, what + " forward");
  expect_close(dgate, dgate_ref, dg_rtol * dgate_ref.abs() + b.terms * terms + 1e-37, what + " dgate");
  expect_close(dup, dup_ref, b.rtol * dup_ref.abs() + 1e-37, what + " dup");
}

void check_geglu_against_reference(const at::Tensor& gate_in, const at::Tensor& up_in, const std::string& what) {
  const at::ScalarType dtype = gate_in.scalar_type();
  at::Tensor gate = gate_in.detach().requires_grad_(), up = up_in.detach().requires_grad_();
  const at::Tensor dy = torch::randn(gate.sizes()).to(dtype);
  const at::Tensor y = opfuse::geglu(gate, up);
  y.backward(dy);
  ASSERT_EQ(y.scalar_type(), dtype);

  constexpr double c = 0.7978845608028654, k = 0.044715;
  const at::Tensor g = gate_in.detach().to(torch::kDouble), u = up_in.detach().to(torch::kDouble);
  // 0.5·(1 + tanh(z/2)) written as σ(z): in float64 too, 1 + tanh cancels for negative g (gelu(−8)
  // would be 0, not −8·σ(−z)); the derivative written out
  const at::Tensor dyd = dy.to(torch::kDouble), z = 2 * c * g * (1 + k * g * g), s = torch::sigmoid(z);
  const at::Tensor dz = 2 * c * (1 + 3 * k * g * g);
  const at::Tensor a = g * s, slope = s + g * s * torch::sigmoid(-z) * dz;
  const at::Tensor y_ref = a * u, dgate_ref = dyd * u * slope, dup_ref = dyd * a;
  const at::Tensor spread = s * (1 - s) * (1 + z.abs());
  const at::Tensor terms = (dyd * u).abs() * (1 + z.abs()) * (1 + (g * dz).abs());

  const Bound b = bound_for(dtype);
  const double dg_rtol = dtype == torch::kBFloat16 ? b.rtol : 0;
  // σ(z) leaves the arithmetic's normal range below z ≈ −87 (float) where g < −10: what is lost
  // there is under the smallest normal number times the factors it multiplies
  const double tiny = dtype == torch::kDouble ? std::numeric_limits<double>::min() : std::numeric_limits<float>::min();
  const at::Tensor gu = (g * u).abs() + 1, gdy = (g * dyd).abs() + 1;
  expect_close(y, y_ref, b.rtol * y_ref.abs() + b.terms * gu * spread + tiny * gu, what + " forward");
  expect_close(gate.grad(), dgate_ref, dg_rtol * dgate_ref.abs() + b.terms * terms + tiny * (terms + 1),
               what + " dgate");
  expect_close(up.grad(), dup_ref, b.rtol * dup_ref.abs() + b.terms * gdy * spread + tiny * gdy, what + " dup");
}

class SwigluTest : public PathAndDtypeTest {};

TEST_P(SwigluTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // Llama's hidden width, rows not a multiple of any vector, one long row split across threads.
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 32, 768}, {3, 77}, {1, 40000}, {5}, {2, 3, 1}}) {
    for (bool packed : {false, true}) {
      const at::Tensor gate = (torch::randn(shape) * 4).to(dtype), up = torch::randn(shape).to(dtype);
      check_against_reference(gate, up, packed, c10::str(packed ? "packed " : "", at::IntArrayRef(shape)));
    }
  }
}

TEST_P(SwigluTest, StridedSaturatedAndEmpty) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor t = torch::randn({30, 8}).to(dtype).t(), u = torch::randn({8, 30}).to(dtype);
  ASSERT_FALSE(t.is_contiguous());
  check_against_reference(t, u, false, "transposed gate");
  const at::Tensor big = torch::tensor({-100.0, -30.0, -1.2785, 0.0, 30.0, 100.0, 1e4, -1e4}).to(dtype);
  check_against_reference(big, torch::randn({8}).to(dtype), false, "saturated gates");
  const at::Tensor none = torch::randn({0, 6}).to(dtype);
  EXPECT_EQ(opfuse::swiglu(none, none).sizes(), none.sizes());
  EXPECT_EQ(opfuse::swiglu(torch::randn({3, 0}).to(dtype)).sizes(), (std::vector<int64_t>{3, 0}));
}

TEST_P(SwigluTest, GegluMatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 32, 768}, {3, 77}, {1, 40000}, {5}}) {
    const at::Tensor gate = (torch::randn(shape) * 4).to(dtype), up = torch::randn(shape).to(dtype);
    check_geglu_against_reference(gate, up, c10::str(at::IntArrayRef(shape)));
  }
  const at::Tensor big = torch::tensor({-100.0, -30.0, -5.0, -0.75, 0.0, 30.0, 100.0, 1e4, -1e4}).to(dtype);
  check_geglu_against_reference(big, torch::randn({9}).to(dtype), "saturated gates");
  const at::Tensor t = torch::randn({30, 8}).to(dtype).t();
  check_geglu_against_reference(t, torch::randn({8, 30}).to(dtype), "transposed gate");
}

INSTANTIATE_TEST_SUITE_P(Ops, SwigluTest, every_path_and_dtype(), path_and_dtype_name);

TEST(Geglu, MatchesAtensGeluTanhAndRaisesOnDoubleBackward) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor g = torch::randn({64, 33}, torch::kDouble) * 3, u = torch::randn({64, 33}, torch::kDouble);
  // ATen's 0.5·g·(1 + tanh(…)) loses |g|·ε to cancellation where g < 0
  EXPECT_TRUE(torch::allclose(opfuse::geglu(g, u), torch::gelu(g, "tanh") * u, 1e-14, 1e-13));
  at::Tensor gr = g.clone().requires_grad_();
  const auto grads = torch::autograd::grad({opfuse::geglu(gr, u).sum()}, {gr}, {}, true, true);
  try {
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::geglu_backward is not implemented"), std::string::npos) << e.what();
  }
  try {
    opfuse::geglu(torch::randn({2, 4}), torch::randn({2, 5}));
    ADD_FAILURE() << "mismatched shapes were accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::geglu"), std::string::npos) << e.what();
  }
}

TEST(Swiglu, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x0 = torch::randn({2, 50000}), dy = torch::randn({2, 25000});
  std::vector<at::Tensor> grads;
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    at::Tensor x = x0.clone().requires_grad_();
    opfuse::swiglu(x).backward(dy);
    grads.push_back(x.grad());
  }
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
}

TEST(Swiglu, DoubleBackwardRaises) {
  at::Tensor g = torch::randn({6}, torch::kDouble).requires_grad_(), u = torch::randn({6}, torch::kDouble);
  const auto grads = torch::autograd::grad({opfuse::swiglu(g, u).sum()}, {g}, {}, true, true);
  try {
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::swiglu_backward is not implemented"), std::string::npos) << e.what();
  }
}

TEST(Swiglu, BadArgumentsNameTheOp) {
  EXPECT_THROW(opfuse::swiglu(torch::randn({2, 4}), torch::randn({2, 5})), c10::Error);
  EXPECT_THROW(opfuse::swiglu(torch::randn({2, 4}), torch::randn({2, 4}, torch::kDouble)), c10::Error);
  try {
    opfuse::swiglu(torch::randn({2, 5}));
    ADD_FAILURE() << "an odd last dimension was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::swiglu_packed: x's last dimension must be even"), std::string::npos);
  }
}

}  // namespace
}  // namespace opfuse::testing::test_swiglu
