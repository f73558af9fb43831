// What the loop asks of all ranks (tune/ranks.cpp), on a workload that plays rank `rank` of a
// group whose other ranks answer from a script: what is decided must not depend on which rank asks.
#include <gtest/gtest.h>

#include <deque>
#include <fmt/format.h>
#include <unistd.h>

#include <stdexcept>

#include "opfuse/workload.h"
#include "tune/distributed.h"

namespace opfuse::tune {
namespace {

class ScriptedRanks : public Workload {
 public:
  ScriptedRanks(int rank, int ranks) : rank_(rank), ranks_(ranks) {}
  // The other ranks' answers to the next gather, in rank order (without this rank's).
  void answer(std::vector<std::string> others) { script_.push_back(std::move(others)); }

  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  std::vector<std::string> gather(const std::string& mine) const override {
    if (script_.empty()) throw std::logic_error("gathered more often than scripted");
    std::vector<std::string> all = script_.front();
    script_.pop_front();
    all.insert(all.begin() + rank_, mine);
    return all;
  }
  bool done() const { return script_.empty(); }

  std::string name() const override { return "scripted"; }
  std::string describe() const override { return ""; }
  int64_t samples_per_step() const override { return 1; }
  std::shared_ptr<Workload> clone() const override { return nullptr; }
  double step() override { return 0; }
  Probe probe(at::ScalarType, uint64_t, double) override { return {}; }
  std::vector<Rewrite> rewrites_for(const analyze::Rule&) const override { return {}; }
  std::vector<std::string> save(const std::string&) const override { return {}; }

 private:
  int rank_, ranks_;
  mutable std::deque<std::vector<std::string>> script_;
};

analyze::Finding finding(const std::string& rule, double time_us) {
  analyze::Finding f;
  f.rule = rule;
  f.pattern = rule + "-chain";
  f.replacement = "opfuse::" + rule;
  f.time_us = time_us;
  return f;
}

TEST(Ranks, ALoneProcessAsksNobody) {
  ScriptedRanks alone(0, 1);  // nothing scripted: any gather would throw
  EXPECT_EQ(each_rank(alone, 2.5), std::vector<double>{2.5});
  EXPECT_EQ(first_failure(alone, "its own reason"), "its own reason");
  EXPECT_NO_THROW(check_same(alone, "anything", "plans"));
  EXPECT_TRUE(sibling_pids(alone).empty());
  EXPECT_EQ(trace_name(alone, "baseline"), "baseline.trace.json");
  const std::vector<analyze::Finding> mine = {finding("silu", 5)};
  EXPECT_EQ(merged_findings(alone, mine).size(), 1u);
}

TEST(Ranks, NumbersComeBackByRankExactly) {
  ScriptedRanks r1(1, 3);
  r1.answer({"0.1", "3.000000000000001"});
  EXPECT_EQ(each_rank(r1, 1.0 / 3), (std::vector<double>{0.1, 1.0 / 3, 3.000000000000001}));
  EXPECT_EQ(trace_name(r1, "tuned"), "rank1.tuned.trace.json");
}

TEST(Ranks, AFailureOnAnyRankIsEveryRanksAndNamesTheFirst) {
  ScriptedRanks r0(0, 3);
  r0.answer({"", "failed verification (output off by 3x)"});
  EXPECT_EQ(first_failure(r0, ""), "on rank 2: failed verification (output off by 3x)");
  r0.answer({"", ""});
  EXPECT_EQ(first_failure(r0, ""), "");
  r0.answer({"late", "later"});
  EXPECT_EQ(first_failure(r0, "mine"), "on rank 0: mine");
}

TEST(Ranks, OnePlanFromEveryRanksFindingsInRankZerosOrder) {
  // Rank 1 saw rope and silu; rank 0 saw silu and swiglu; only rank 2 saw gelu.
  const std::vector<analyze::Finding> mine = {finding("rope", 7), finding("silu", 9)};
  ScriptedRanks r1(1, 3);
  const std::string rank0 = R"([{"rule":"silu","kind":"","pattern":"silu-chain","replacement":"opfuse::silu","mined":false},
                               {"rule":"swiglu","kind":"","pattern":"swiglu-chain","replacement":"opfuse::swiglu","mined":false}])";
  const std::string rank2 = R"([{"rule":"gelu","kind":"","pattern":"gelu-chain","replacement":"opfuse::gelu","mined":true}])";
  r1.answer({rank0, rank2});
  const std::vector<analyze::Finding> merged = merged_findings(r1, mine);
  ASSERT_EQ(merged.size(), 4u);
  EXPECT_EQ(merged[0].rule, "silu");
  EXPECT_EQ(merged[0].time_us, 9);  // this rank's own figures where it has the finding
  EXPECT_EQ(merged[1].rule, "swiglu");
  EXPECT_EQ(merged[1].replacement, "opfuse::swiglu");
  EXPECT_EQ(merged[2].rule, "rope");
  EXPECT_EQ(merged[3].rule, "gelu");
  EXPECT_TRUE(merged[3].mined);
  EXPECT_TRUE(r1.done());
}

TEST(Ranks, DifferentPlansAreRefusedNamingTheRanks) {
  ScriptedRanks r0(0, 3);
  r0.answer({"silu (17 places)", "silu (16 places)"});
  try {
    check_same(r0, "silu (17 places)", "the rewrites that apply");
    FAIL() << "different plans passed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the ranks differ in the rewrites that apply: rank 0: silu (17 places); rank 2: silu (16 places)");
  }
  r0.answer({"same", "same"});
  EXPECT_NO_THROW(check_same(r0, "same", "plans"));
}

TEST(Ranks, SiblingsAreTheOtherRanksOnThisMachine) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  ScriptedRanks r1(1, 4);
  r1.answer({fmt::format("100 {}", host), fmt::format("300 {}", host), "400 elsewhere"});
  EXPECT_EQ(sibling_pids(r1), (std::vector<int>{100, 300}));
}

}  // namespace
}  // namespace opfuse::tune
