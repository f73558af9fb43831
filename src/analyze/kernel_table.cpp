// Device time per kernel name: on a GPU trace this, not host self time, is where the step goes.
#include <algorithm>

#include "opfuse/analyze.h"

namespace opfuse::analyze {

std::vector<KernelStat> kernel_table(const trace::Trace& t, const trace::Links& m) {
  std::vector<int32_t> row(m.device_lanes.empty() ? 0 : t.strings.size(), -1);  // per name id
  std::vector<KernelStat> out;
  for (const auto& lane : m.device_lanes)
    for (int32_t i : lane) {
      const trace::Event& e = t.events[i];
      int32_t& r = row[e.name];
      if (r < 0) r = static_cast<int32_t>(out.size()), out.push_back({t.strings[e.name]});
      out[r].count += 1;
      out[r].total_us += e.dur;
    }
  std::stable_sort(out.begin(), out.end(), [](const KernelStat& a, const KernelStat& b) { return a.total_us > b.total_us; });
  return out;
}

}  // namespace opfuse::analyze
