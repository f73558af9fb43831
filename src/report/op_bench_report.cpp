#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "opfuse/report.h"

namespace opfuse::report {

std::string format_op_bench(const bench::OpBenchResult& r) {
  const double fused = r.variants.back().median_ms;
  std::vector<Row> rows;
  for (const auto& v : r.variants) {
    rows.push_back({v.name, v.what, fmt::format("{:.3f}", v.median_ms),
                    fmt::format("{:.3f}-{:.3f}", v.min_ms, v.max_ms), fmt::format("x{:.2f}", v.median_ms / fused)});
  }
  std::string out = fmt::format("bench-op {}  shape {}  float32  threads {}  cpu path {}\n", r.op, r.shape,
                                r.threads, r.capability);
  out += "forward+backward, median of the rounds (opfuse = x1.00; higher is slower)\n\n";
  out += format_table({"variant", "runs", "median ms", "range ms", "vs opfuse"}, rows);
  out += fmt::format("\nopfuse vs reference  x{:.2f}\nopfuse vs aten       x{:.2f}\n", r.speedup_vs_reference,
                     r.speedup_vs_aten);
  out += fmt::format("opfuse bandwidth     {:.1f} GB/s (copy in the same run: {:.1f} GB/s)\n", r.opfuse_gbps,
                     r.copy_gbps);
  return out;
}

nlohmann::json op_bench_json(const bench::OpBenchResult& r) {
  nlohmann::json ms = nlohmann::json::object();
  for (const auto& v : r.variants) ms[v.name] = v.median_ms;
  return {{"op", r.op},
          {"numel", r.numel},
          {"shape", r.shape},
          {"threads", r.threads},
          {"cpu_capability", r.capability},
          {"ms", ms},
          {"speedup_vs_reference", r.speedup_vs_reference},
          {"speedup_vs_aten", r.speedup_vs_aten},
          {"opfuse_gbps", r.opfuse_gbps},
          {"copy_gbps", r.copy_gbps}};
}

void refuse_overwrite(const std::string& path, bool overwrite) {
  if (!overwrite && std::filesystem::exists(path))
    throw std::invalid_argument(fmt::format("{}: already exists (pass --force to replace it)", path));
}

void write_json(const std::string& path, const nlohmann::json& value, bool overwrite) {
  refuse_overwrite(path, overwrite);
  std::ofstream out(path);
  if (!out) throw std::runtime_error(fmt::format("{}: cannot open for writing", path));
  // Invalid UTF-8 (say, in a path) is replaced rather than losing the whole result.
  out << value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!out) throw std::runtime_error(fmt::format("{}: write failed", path));
}

void write_text(const std::string& path, const std::string& text, bool overwrite) {
  refuse_overwrite(path, overwrite);
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error(fmt::format("{}: cannot write", path));
}

}  // namespace opfuse::report
