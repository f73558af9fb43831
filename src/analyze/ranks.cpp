// Many ranks' analyses side by side: each rank's step time, the slowest rank and how far behind,
// and the findings merged across ranks with their spread.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "opfuse/analyze.h"
#include "opfuse/stats.h"

namespace opfuse::analyze {
namespace {

// The number after the last "rank" in a file name ("rank3.json", "trace_rank_12.pt.trace.json").
int64_t rank_in_name(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  for (size_t at = name.rfind("rank"); at != std::string::npos; at = at == 0 ? std::string::npos : name.rfind("rank", at - 1)) {
    size_t i = at + 4;
    while (i < name.size() && (name[i] == '_' || name[i] == '-')) ++i;
    size_t end = i;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > i && end - i < 9) return std::stoll(name.substr(i, end - i));
  }
  return -1;
}

std::vector<int64_t> ranks_of(const std::vector<Analysis>& analyses) {
  std::vector<int64_t> ranks;
  bool all_known = true;
  for (const auto& a : analyses) {
    ranks.push_back(a.trace.rank >= 0 ? a.trace.rank : rank_in_name(a.trace.path));
    all_known = all_known && ranks.back() >= 0;
  }
  if (!all_known)
    for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int64_t>(i);
  std::map<int64_t, size_t> seen;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (auto [it, fresh] = seen.emplace(ranks[i], i); !fresh)
      throw std::invalid_argument(fmt::format("{} and {} are both rank {}: name one trace per rank (a glob such as "
                                              "'DIR/rank*.baseline.trace.json')",
                                              analyses[it->second].trace.path, analyses[i].trace.path, ranks[i]));
  return ranks;
}

double units(const Summary& s) { return s.steps > 0 ? static_cast<double>(s.steps) : 1.0; }

}  // namespace

Ranks compare_ranks(const std::vector<Analysis>& analyses) {
  Ranks out;
  const std::vector<int64_t> ranks = ranks_of(analyses);
  for (const auto& a : analyses) out.per_step = out.per_step && a.trace.steps > 0;
  for (size_t i = 0; i < analyses.size(); ++i) {
    const Summary& s = analyses[i].trace;
    out.ranks.push_back({ranks[i], s.path, s.steps, out.per_step ? s.step_us : s.duration_us});
  }
  std::sort(out.ranks.begin(), out.ranks.end(), [](const RankTime& a, const RankTime& b) { return a.rank < b.rank; });
  if (out.ranks.empty()) return out;
  std::vector<double> steps;
  for (const auto& r : out.ranks) steps.push_back(r.step_us);
  const auto slowest = std::max_element(out.ranks.begin(), out.ranks.end(),
                                        [](const RankTime& a, const RankTime& b) { return a.step_us < b.step_us; });
  out.slowest_rank = slowest->rank;
  const double typical = median(steps);
  out.behind_pct = typical > 0 ? 100 * (slowest->step_us / typical - 1) : 0;

  // Findings by (rule, pattern), in the order first seen; savings per step on each rank.
  std::map<std::pair<std::string, std::string>, size_t> index;
  std::vector<std::vector<double>> savings, times;
  for (const auto& a : analyses)
    for (const Finding& f : a.findings) {
      const auto key = std::make_pair(f.rule, f.pattern);
      auto [it, fresh] = index.emplace(key, out.findings.size());
      if (fresh) {
        out.findings.push_back({f.rule, f.pattern, f.replacement, f.mined});
        savings.emplace_back();
        times.emplace_back();
      }
      savings[it->second].push_back(f.est_saving_us / units(a.trace));
      times[it->second].push_back(f.time_us / units(a.trace));
    }
  for (size_t k = 0; k < out.findings.size(); ++k) {
    RankFinding& f = out.findings[k];
    f.ranks = static_cast<int>(savings[k].size());
    const auto [lo, hi] = std::minmax_element(savings[k].begin(), savings[k].end());
    f.saving_us_min = *lo, f.saving_us_max = *hi;
    f.saving_us_median = median(savings[k]);
    f.time_us_median = median(times[k]);
  }
  std::stable_sort(out.findings.begin(), out.findings.end(),
                   [](const RankFinding& a, const RankFinding& b) { return a.saving_us_median > b.saving_us_median; });
  return out;
}

}  // namespace opfuse::analyze
