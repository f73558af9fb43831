// The cost model: what a match takes now and what its fused op would take, so what fusing it saves.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analyze/match.h"

namespace opfuse::analyze {

struct MatchCost {
  double time_us = 0;      // what the fusion can save from (less profiling's cost)
  double recorded_us = 0;  // as the trace records it: host time, or device time on device backends
  double host_us = 0, device_us = 0;
  double fused_us = 0;  // the fused op's estimated time
  std::string how;      // how fused_us was estimated ("measured opfuse::silu", "bandwidth", …)
  int64_t ops = 0;      // the ops that vanish with the fusion: the chain, its wrapper, a step's children
  bool estimated = true;  // false: a layout change whose convolutions could not be timed
  double saving_us() const { return time_us > fused_us ? time_us - fused_us : 0; }
};

class CostModel {
 public:
  // `measure` (may be empty) times an opfuse op at given input shapes; each (op, shapes) once.
  CostModel(OpIndex& index, Measure measure) : index(index), measure_(std::move(measure)) {}

  MatchCost of(const Match& mt);

 private:
  template <class Cost>
  double over_match(const Match& mt, Cost cost) const;
  double match_time(const Match& mt) const;
  int64_t covered_ops(const Match& mt) const;
  double fused_time(const Match& mt, std::string& how);
  double measured_time(const Match& mt, const std::vector<int32_t>& ops, std::string& how);
  Shape dim_order(const std::vector<int32_t>& ops, size_t rank, int depth = 0) const;
  void add_shapes(int32_t e, std::vector<const Shape*>& distinct, int depth = 0);
  double product_time(int32_t e) const;
  double others_fused_time(const Match& mt, const std::vector<int32_t>& ops, bool products, double products_time,
                           std::string& how);
  const std::vector<int32_t>& bytes_ops(const Match& mt);
  double parameter_bytes(const std::vector<int32_t>& ops);
  double measure(const std::string& op, std::vector<const Shape*> shapes);
  double timed(const std::string& op, const std::string& dims);
  bool layout_cost(const Match& mt, MatchCost& c);
  int32_t backward_of(int32_t e);

  OpIndex& index;
  Measure measure_;
  std::map<std::pair<std::string, std::string>, double> measured;
  std::vector<int32_t> children;  // scratch: an optimizer step's ops
  // The backward ops by sequence number, made on first use (once, even where a trace has none).
  std::optional<std::map<int64_t, int32_t>> backward_by_sequence_;
};

}  // namespace opfuse::analyze
