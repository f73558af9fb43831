// Where an op is in the model: its module, annotation or the user's frame.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opfuse/trace.h"

namespace opfuse::analyze {

class Locator {
 public:
  Locator(const trace::Trace& trace, const trace::Links& links) : t(trace), m(links) {}

  // The op's place as an id (thousands of matches share a few places, so each string is made
  // once): its Module Hierarchy, else the enclosing module annotation, else the innermost
  // call-stack frame outside torch; a backward op borrows the place of the forward op it
  // differentiates ("features.3 (backward)").
  uint32_t location(int32_t e) { return location(e, true); }
  const std::string& where(uint32_t id) const { return places[id]; }

 private:
  uint32_t location(int32_t e, bool follow_forward);
  uint32_t place(uint32_t string_id, std::vector<int32_t>& cache);

  const trace::Trace& t;
  const trace::Links& m;
  trace::Strings places;              // the locations matches are at
  std::vector<int32_t> as_is, frame;  // per trace string id: its place as it is / as a call stack
  std::vector<int32_t> backward;      // per place: the place of its backward ops
};

}  // namespace opfuse::analyze
