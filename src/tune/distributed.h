// What the loop asks of all the ranks that train a workload together (torch.distributed): each
// answer is the same on every rank, so every rank plans, keeps and measures alike. For a lone
// process each is its own answer, at no cost.
#pragma once

#include <string>
#include <vector>

#include "opfuse/analyze.h"
#include "opfuse/workload.h"

namespace opfuse::tune {

// Every rank's x, by rank.
std::vector<double> each_rank(const Workload& w, double x);

// "" when every rank's `why` is empty (it passed); else the first failing rank's, naming it.
std::string first_failure(const Workload& w, const std::string& why);

// Every rank's findings: rank 0's in its order, then those only later ranks had, so that one
// plan is made on what any rank saw (a chain near a threshold may show on one rank only).
std::vector<analyze::Finding> merged_findings(const Workload& w, const std::vector<analyze::Finding>& mine);

// Throws std::runtime_error naming the ranks whose `what` differs from rank 0's.
void check_same(const Workload& w, const std::string& what, const std::string& subject);

// The other ranks' process ids on this machine: their CPU time is the job's, not other load.
std::vector<int> sibling_pids(const Workload& w);

// "baseline.trace.json" alone, "rank1.baseline.trace.json" among ranks.
std::string trace_name(const Workload& w, const std::string& stage);

}  // namespace opfuse::tune
