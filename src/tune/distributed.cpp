#include "tune/distributed.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <stdexcept>

namespace opfuse::tune {

std::vector<double> each_rank(const Workload& w, double x) {
  if (w.ranks() == 1) return {x};
  std::vector<double> all;
  for (const std::string& s : w.gather(fmt::format("{:.17g}", x))) all.push_back(std::stod(s));
  return all;
}

std::string first_failure(const Workload& w, const std::string& why) {
  if (w.ranks() == 1) return why;
  const std::vector<std::string> all = w.gather(why);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) return fmt::format("on rank {}: {}", r, all[r]);
  return "";
}

namespace {

// What planning reads of a finding.
nlohmann::json plan_fields(const analyze::Finding& f) {
  return {{"rule", f.rule}, {"kind", f.kind}, {"pattern", f.pattern}, {"replacement", f.replacement}, {"mined", f.mined}};
}

bool same_finding(const analyze::Finding& f, const nlohmann::json& j) {
  return f.rule == j["rule"] && f.pattern == j["pattern"] && f.mined == j["mined"].get<bool>();
}

}  // namespace

std::vector<analyze::Finding> merged_findings(const Workload& w, const std::vector<analyze::Finding>& mine) {
  if (w.ranks() == 1) return mine;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : mine) list.push_back(plan_fields(f));
  std::vector<analyze::Finding> merged;
  for (const std::string& rank_findings : w.gather(list.dump()))
    for (const nlohmann::json& j : nlohmann::json::parse(rank_findings)) {
      bool known = false;
      for (const auto& f : merged) known = known || same_finding(f, j);
      if (known) continue;
      analyze::Finding f;  // this rank's own figures where it has the finding too
      for (const auto& m : mine)
        if (same_finding(m, j)) f = m;
      f.rule = j["rule"], f.kind = j["kind"], f.pattern = j["pattern"], f.replacement = j["replacement"];
      f.mined = j["mined"];
      merged.push_back(f);
    }
  return merged;
}

void check_same(const Workload& w, const std::string& what, const std::string& subject) {
  if (w.ranks() == 1) return;
  const std::vector<std::string> all = w.gather(what);
  std::string differing;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differing += fmt::format("; rank {}: {}", r, all[r]);
  if (!differing.empty())
    throw std::runtime_error(fmt::format("the ranks differ in {}: rank 0: {}{}", subject, all[0], differing));
}

std::vector<int> sibling_pids(const Workload& w) {
  if (w.ranks() == 1) return {};
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::vector<std::string> all = w.gather(fmt::format("{} {}", getpid(), host));
  std::vector<int> pids;
  for (size_t r = 0; r < all.size(); ++r) {
    const size_t space = all[r].find(' ');
    if (static_cast<int>(r) != w.rank() && all[r].substr(space + 1) == host) pids.push_back(std::stoi(all[r]));
  }
  return pids;
}

std::string trace_name(const Workload& w, const std::string& stage) {
  return (w.ranks() == 1 ? "" : fmt::format("rank{}.", w.rank())) + stage + ".trace.json";
}

}  // namespace opfuse::tune
