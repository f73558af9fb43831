#include <fmt/format.h>


#include "opfuse/report.h"

namespace opfuse::report {

namespace {

std::string ratio_cell(const measure::Ratio& r) {
  return fmt::format("x{:.2f} {}", r.estimate, measure::format_interval(r.ci, "x{:.2f}"));
}

}  // namespace

std::string format_op_bench(const bench::OpBenchResult& r) {
  const double fused = r.variants.back().ms.median;
  std::vector<Row> rows;
  for (const auto& v : r.variants) {
    rows.push_back({v.name, v.what, fmt::format("{:.3f} {}", v.ms.median, measure::format_interval(v.ms.ci, "{:.3f}")),
                    fmt::format("{:.3f}-{:.3f}", v.ms.min, v.ms.max), fmt::format("{:.2f}", v.spread),
                    fmt::format("x{:.2f}", v.ms.median / fused), fmt::format("{:.1f}", v.peak_bytes / 1048576.0)});
  }
  std::string out = fmt::format("bench-op {}  shape {}  float32  threads {}  cpu path {}\n", r.op, r.shape,
                                r.threads, r.capability);
  out += format_environment(r.environment) + format_machine(r.machine);
  out += fmt::format("\n{} per call, {} rounds interleaved (opfuse = x1.00; higher is slower)\n\n", r.timed, r.rounds);
  out += format_table({"variant", "runs", "median ms [95% CI]", "range ms", "max/min", "vs opfuse", "peak MiB"}, rows);
  out += fmt::format("\nopfuse vs reference  {} (paired rounds)\nopfuse vs aten       {}\n",
                     ratio_cell(r.speedup_vs_reference), ratio_cell(r.speedup_vs_aten));
  out += fmt::format("opfuse bandwidth     {:.1f} GB/s (copy in the same run: {:.1f} GB/s; {:.0f} % of it)\n",
                     r.opfuse_gbps, r.copy_gbps, 100 * r.opfuse_gbps / r.copy_gbps);
  if (r.aten_step_gbps > 0)
    out += fmt::format("ATen x * 2 step      {:.1f} GB/s ({:.0f} % of copy): one ATen op's forward+backward through "
                       "autograd, moving as many bytes\n",
                       r.aten_step_gbps, 100 * r.aten_step_gbps / r.copy_gbps);
  return out;
}

nlohmann::json op_bench_json(const bench::OpBenchResult& r) {
  nlohmann::json ms = nlohmann::json::object(), variants = nlohmann::json::array();
  for (const auto& v : r.variants) {
    ms[v.name] = v.ms.median;
    variants.push_back({{"name", v.name},
                        {"what", v.what},
                        {"ms", v.ms.median},
                        {"ms_ci", interval_json(v.ms.ci)},
                        {"ms_rounds", v.ms.ms},
                        {"spread", v.spread},
                        {"peak_bytes", v.peak_bytes}});
  }
  return {{"op", r.op},
          {"numel", r.numel},
          {"shape", r.shape},
          {"threads", r.threads},
          {"rounds", r.rounds},
          {"cpu_capability", r.capability},
          {"ms", ms},
          {"variants", variants},
          {"speedup_vs_reference", r.speedup_vs_reference.estimate},
          {"speedup_vs_reference_ci", interval_json(r.speedup_vs_reference.ci)},
          {"speedup_vs_aten", r.speedup_vs_aten.estimate},
          {"speedup_vs_aten_ci", interval_json(r.speedup_vs_aten.ci)},
          {"opfuse_gbps", r.opfuse_gbps},
          {"copy_gbps", r.copy_gbps},
          {"aten_step_gbps", r.aten_step_gbps},
          {"machine", machine_json(r.machine)},
          {"environment", environment_json(r.environment)}};
}

}  // namespace opfuse::report
