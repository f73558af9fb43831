// The roofline: each op's FLOPs and bytes from its recorded shapes, worked out by hand, and the
// op table's verdict against given peaks (memory- or compute-bound, and the share of the peak).
#include <gtest/gtest.h>

#include <string>

#include "opfuse/analyze.h"
#include "opfuse/report.h"

namespace opfuse::analyze {
namespace {

Work work(const std::string& op, const std::vector<std::vector<int64_t>>& dims, const std::string& type = "float") {
  std::vector<std::string_view> types(dims.size(), type);
  return op_work(op, dims, types);
}

TEST(Roofline, MatrixProducts) {
  const Work mm = work("aten::mm", {{64, 128}, {128, 32}});
  EXPECT_DOUBLE_EQ(mm.flops, 2.0 * 64 * 128 * 32);
  EXPECT_DOUBLE_EQ(mm.bytes, 4.0 * (64 * 128 + 128 * 32 + 64 * 32));
  const Work addmm = work("aten::addmm", {{32}, {64, 128}, {128, 32}});
  EXPECT_DOUBLE_EQ(addmm.flops, mm.flops);
  EXPECT_DOUBLE_EQ(addmm.bytes, mm.bytes + 4 * 32);
  const Work linear = work("aten::linear", {{8, 16, 128}, {32, 128}, {32}});  // 128 rows of 128 → 32
  EXPECT_DOUBLE_EQ(linear.flops, 2.0 * 128 * 128 * 32);
  const Work bmm = work("aten::bmm", {{4, 8, 16}, {4, 16, 2}});
  EXPECT_DOUBLE_EQ(bmm.flops, 2.0 * 4 * 8 * 16 * 2);
  const Work half = work("aten::mm", {{64, 128}, {128, 32}}, "c10::BFloat16");
  EXPECT_DOUBLE_EQ(half.bytes, mm.bytes / 2);
  EXPECT_DOUBLE_EQ(work("aten::mm", {{64, 128}, {64, 32}}).flops, 0);  // shapes that do not multiply
  const int64_t huge = int64_t{1} << 40;  // past an int64 once multiplied: counted in floating point
  EXPECT_DOUBLE_EQ(work("aten::mm", {{huge, huge}, {huge, huge}}).flops, 2.0 * 1099511627776.0 * 1099511627776.0 * 1099511627776.0);
}

TEST(Roofline, ConvolutionsAtTheirOutputsSizeElseAtStrideOne) {
  const Work conv = work("aten::convolution", {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}});
  EXPECT_DOUBLE_EQ(conv.flops, 2.0 * (2 * 4 * 8 * 8) * (3 * 3 * 3));
  const Work backward = work("aten::convolution_backward", {{2, 4, 8, 8}, {2, 3, 8, 8}, {4, 3, 3, 3}});
  EXPECT_DOUBLE_EQ(backward.flops, 2 * conv.flops);  // both gradients
  const std::vector<std::string_view> types(3, "float");
  const std::vector<int64_t> strided = {2, 4, 4, 4}, another_batch = {3, 4, 4, 4};
  EXPECT_DOUBLE_EQ(op_work("aten::convolution", {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}}, types, &strided).flops, conv.flops / 4);
  EXPECT_DOUBLE_EQ(op_work("aten::convolution", {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}}, types, &another_batch).flops, conv.flops);
  EXPECT_TRUE(convolution_forward("aten::mkldnn_convolution"));
  EXPECT_FALSE(convolution_forward("aten::convolution_backward"));
}

// A strided convolution in a trace: its output's size is the gradient its backward received,
// found by its sequence number from the op it runs inside (mkldnn_convolution in convolution).
TEST(Roofline, TheOpTableCountsAStridedConvolutionAtItsOutputsSize) {
  const std::string json = R"([
    {"ph":"X","cat":"cpu_op","name":"aten::convolution","pid":1,"tid":1,"ts":0,"dur":100,"args":{"Input Dims":[[2,3,8,8],[4,3,3,3]],"Input type":["float","float"],"Sequence number":7}},
    {"ph":"X","cat":"cpu_op","name":"aten::mkldnn_convolution","pid":1,"tid":1,"ts":1,"dur":90,"args":{"Input Dims":[[2,3,8,8],[4,3,3,3]],"Input type":["float","float"]}},
    {"ph":"X","cat":"cpu_op","name":"ConvolutionBackward0","pid":1,"tid":1,"ts":200,"dur":100,"args":{"Input Dims":[[2,4,4,4]],"Sequence number":7}},
    {"ph":"X","cat":"cpu_op","name":"aten::convolution_backward","pid":1,"tid":1,"ts":201,"dur":90,"args":{"Input Dims":[[2,4,4,4],[2,3,8,8],[4,3,3,3]],"Input type":["float","float","float"]}}])";
  const Analysis a = analyze(trace::parse_trace(json, "t.json"), "t.json", {}, {});
  const double at_stride_two = 2.0 * (2 * 4 * 4 * 4) * (3 * 3 * 3);
  int seen = 0;
  for (const OpStat& op : a.ops)
    if (op.name == "aten::convolution" || op.name == "aten::mkldnn_convolution") {
      EXPECT_DOUBLE_EQ(op.flops, at_stride_two) << op.name;
      ++seen;
    }
  EXPECT_EQ(seen, 2);
}

TEST(Roofline, ElementwiseNormsSoftmaxAttention) {
  const Work mul = work("aten::mul", {{4, 4}, {4, 4}});
  EXPECT_DOUBLE_EQ(mul.flops, 16);
  EXPECT_DOUBLE_EQ(mul.bytes, 4.0 * (32 + 16));
  const Work add_scalar = work("aten::add", {{4, 4}, {}});
  EXPECT_DOUBLE_EQ(add_scalar.bytes, 4.0 * (16 + 16));
  EXPECT_DOUBLE_EQ(work("aten::native_layer_norm", {{8, 64}, {}, {64}, {64}}).bytes, 4.0 * 2 * 8 * 64);
  EXPECT_DOUBLE_EQ(work("aten::_softmax", {{8, 64}, {}, {}}).flops, 5.0 * 8 * 64);
  const Work sdpa = work("aten::scaled_dot_product_attention", {{2, 4, 16, 8}, {2, 4, 32, 8}, {2, 4, 32, 8}});
  EXPECT_DOUBLE_EQ(sdpa.flops, 4.0 * (2 * 4) * 16 * 32 * 8);
  EXPECT_DOUBLE_EQ(work("aten::unknown_op", {{4, 4}}).flops, 0);
  EXPECT_DOUBLE_EQ(work("aten::mul", {}).bytes, 0);
}

// A matrix product and an elementwise op in a trace: the table sums their work over the calls
// and, with peaks given, says the product is compute-bound and the mul memory-bound.
TEST(Roofline, TheOpTableSaysWhatBoundsEachOp) {
  const std::string json = R"([
    {"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":0,"dur":100,"args":{"Input Dims":[[512,512],[512,512]],"Input type":["float","float"]}},
    {"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":200,"dur":10,"args":{"Input Dims":[[1000],[1000]],"Input type":["float","float"]}},
    {"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":300,"dur":10,"args":{"Input Dims":[[1000],[1000]],"Input type":["float","float"]}},
    {"ph":"X","cat":"cpu_op","name":"aten::view","pid":1,"tid":1,"ts":400,"dur":1,"args":{"Input Dims":[[1000],[]],"Input type":["float",""]}}])";
  const trace::Trace t = trace::parse_trace(json, "t.json");
  Options o;
  o.roofline.flops_per_s = 100e9, o.roofline.bytes_per_s = 10e9, o.roofline.threads = 2, o.roofline.source = "given";
  const Analysis a = analyze(t, "t.json", {}, o);
  const nlohmann::json j = report::analysis_json(a);
  for (const auto& op : j["ops"]) {
    const std::string name = op["name"];
    if (name == "aten::mm") {
      EXPECT_DOUBLE_EQ(op["flops"].get<double>(), 2.0 * 512 * 512 * 512);
      EXPECT_EQ(op["bound"], "compute");  // 85 FLOP per byte, above the balance of 10
      EXPECT_NEAR(op["peak_pct"].get<double>(), 100 * (2.0 * 512 * 512 * 512 / 100e-6) / 100e9, 1e-9);
    } else if (name == "aten::mul") {
      EXPECT_DOUBLE_EQ(op["flops"].get<double>(), 2000);
      EXPECT_DOUBLE_EQ(op["bytes"].get<double>(), 2 * 4.0 * 3000);
      EXPECT_DOUBLE_EQ(op["work_us"].get<double>(), 20);
      EXPECT_EQ(op["bound"], "memory");
      EXPECT_NEAR(op["peak_pct"].get<double>(), 100 * (24000 / 20e-6) / 10e9, 1e-9);
    } else {
      EXPECT_TRUE(op["bound"].is_null()) << name;
    }
  }
  EXPECT_EQ(j["roofline"]["threads"], 2);
  const std::string text = report::format_analysis(a, 15);
  EXPECT_NE(text.find("memory 12%"), std::string::npos) << text;
  EXPECT_NE(text.find("an op below 10.0 FLOP per byte is bound by memory"), std::string::npos) << text;
}

}  // namespace
}  // namespace opfuse::analyze
