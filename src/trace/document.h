// One JSON document of trace events → Trace, with simdjson's on-demand parser. document.cpp is
// compiled once per instruction set (simdjson picks its kernel at compile time for on-demand),
// and reader.cpp calls the one this CPU supports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "opfuse/trace.h"

namespace opfuse::trace::detail {

// What the top-level object says besides its events.
struct TopLevel {
  bool opfuse = false;  // an "opfuse" key not naming torch.profiler: opfuse's own profiler wrote it
  int64_t rank = -1;    // "distributedInfo": {"rank": N}, as Kineto writes for each process
  std::vector<std::pair<std::string, int64_t>> memory_before;  // "opfuse": {"memory_before": {what: bytes}}
  double plain_step_us = 0;                                    // "opfuse": {"plain_step_ms": ms}
  void add(const TopLevel& o) {
    opfuse |= o.opfuse;
    if (o.rank >= 0) rank = o.rank;
    if (!o.memory_before.empty()) memory_before = o.memory_before;
    if (o.plain_step_us > 0) plain_step_us = o.plain_step_us;
  }
};

struct Document {
  std::string_view json;  // followed by at least simdjson's padding of readable bytes
  std::string_view name;  // labels errors and warnings
  int64_t base = 0;       // byte offset of json[0] in the file
  // In: the origin to measure from (a chunk after the first takes the file's). Out: the origin,
  // and whether there was one.
  bool has_origin = false;
  int64_t origin_us = 0;
  TopLevel top{};
  int64_t entries = 0;           // entries read from "traceEvents" arrays, usable or not
};

// Parses an array of events or an object with "traceEvents". Throws std::invalid_argument
// "NAME: <what> at byte N" ("NAME: truncated at byte N (…)" when the text stops inside a string,
// array or object, N its end). An event it cannot use is skipped and warned about.
Trace parse_document_haswell(Document& doc);
Trace parse_document_generic(Document& doc);

}  // namespace opfuse::trace::detail
