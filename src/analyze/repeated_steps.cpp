// Steps from a repeated pattern of top-level ops (see repeated_steps.h).
#include "analyze/repeated_steps.h"

#include <algorithm>
#include <string>

#include "opfuse/stats.h"

namespace opfuse::analyze {
namespace {

// The smallest p with s[i] == s[i + p] for every i: n minus the longest proper border of s
// (Knuth–Morris–Pratt's failure function). Any stretch of P P P … has P's length as a period,
// so a trace that starts or ends inside a step still shows it.
size_t smallest_period(const std::vector<uint32_t>& s) {
  std::vector<size_t> border(s.size(), 0);
  for (size_t i = 1, k = 0; i < s.size(); ++i) {
    while (k > 0 && s[i] != s[k]) k = border[k - 1];
    if (s[i] == s[k]) ++k;
    border[i] = k;
  }
  return s.size() - (s.empty() ? 0 : border.back());
}

bool is_training_name(const std::string& name) {
  return name.compare(0, 10, "Optimizer.") == 0 || name.find("Backward") != std::string::npos ||
         name.compare(0, 35, "autograd::engine::evaluate_function") == 0;
}

}  // namespace

RepeatedSteps repeated_steps(const trace::Trace& t, const trace::Model& m) {
  const std::vector<int32_t>* main = nullptr;
  for (const auto& ops : m.threads)
    if (main == nullptr || ops.size() > main->size()) main = &ops;
  if (main == nullptr || main->size() < 4) return {};
  std::vector<uint32_t> names(main->size());
  for (size_t i = 0; i < names.size(); ++i) names[i] = t.events[(*main)[i]].name;

  const size_t p = smallest_period(names), k = names.size() / p;
  if (p < 2 || k < 2) return {};
  const bool training = std::any_of(names.begin(), names.begin() + p, [&](uint32_t n) { return is_training_name(t.strings[n]); });
  if (!training) return {};

  std::vector<double> spans;  // first op of a repeat to the first of the next
  for (size_t j = 0; (j + 1) * p < names.size(); ++j)
    spans.push_back(t.events[(*main)[(j + 1) * p]].ts - t.events[(*main)[j * p]].ts);
  return {static_cast<int64_t>(k), p, median(spans)};
}

}  // namespace opfuse::analyze
