// Intervals, the machine's load and the environment, as every command reports them.
#include <fmt/format.h>

#include <cmath>

#include "opfuse/report.h"

namespace opfuse::report {

nlohmann::json interval_json(const measure::Interval& i) {
  auto bound = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  return nlohmann::json::array({bound(i.lo), bound(i.hi)});
}

nlohmann::json machine_json(const measure::Machine& m) {
  return {{"cores", m.cores},
          {"busy_share_of_others", m.others_share},
          {"own_share", m.own_share},
          {"busy", m.busy},
          {"warning", m.warning.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.warning)}};
}

nlohmann::json environment_json(const measure::Environment& e) {
  return {{"blas", e.blas},         {"reference_blas", e.reference_blas}, {"threads", e.threads},
          {"cores", e.cores},       {"cpu_capability", e.cpu_capability}, {"torch", e.torch},
          {"warnings", e.warnings}};
}

std::string format_environment(const measure::Environment& e) {
  std::string out = fmt::format("environment: BLAS {}; {} intra-op thread{} on {} cores; cpu path {}; LibTorch {}\n",
                                e.blas, e.threads, e.threads == 1 ? "" : "s", e.cores, e.cpu_capability, e.torch);
  for (const auto& w : e.warnings) out += "warning: " + w + "\n";
  return out;
}

std::string format_machine(const measure::Machine& m) {
  if (m.busy) return "warning: " + m.warning + "\n";
  return fmt::format("machine: quiet (others used {:.0f}% of the {} cores while measuring)\n", 100 * m.others_share,
                     m.cores);
}

}  // namespace opfuse::report
