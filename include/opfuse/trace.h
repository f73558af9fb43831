// One Trace type, whatever wrote the Chrome trace: PyTorch Kineto (2.x and the 1.8-era
// layout), the legacy profiler, opfuse's own profiler, or the Ascend profiler's trace_view.json.
// The reader keeps only what analysis needs: interned names and compact records.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace opfuse::trace {

enum class Dialect { kineto, kineto_legacy_1_8, legacy_profiler, opfuse, ascend, unknown };
const char* dialect_name(Dialect d);

struct Event {
  uint32_t name = 0, category = 0;  // indices into Trace::strings
  char phase = 'X';                 // X, B, E, s, f, i, C
  int64_t pid = 0, tid = 0;         // string pids/tids ("stream 7") are interned: −1 − string index
  double ts = 0, dur = 0;           // microseconds
  int64_t sequence_nr = -1, external_id = -1, correlation = -1, flow_id = -1;
  uint32_t module = 0;  // "Module Hierarchy" (0: none)
};

struct Trace {
  Dialect dialect = Dialect::unknown;
  std::vector<std::string> strings{""};  // index 0 is the empty string
  std::vector<Event> events;             // every non-metadata event, in file order
  std::unordered_map<int64_t, std::string> process_names, thread_names;

  const std::string& name(const Event& e) const { return strings[e.name]; }
  uint32_t intern(std::string_view s);

 private:
  std::unordered_map<std::string, uint32_t> index_;
};

// Reads PATH (.json or .json.gz; a JSON array of events or an object with "traceEvents").
// Throws std::invalid_argument "PATH: <what> at byte N" for unreadable or malformed input.
Trace read_trace(const std::string& path);
// The same from bytes already in memory; `name` only labels errors.
Trace parse_trace(std::string_view json, const std::string& name);

}  // namespace opfuse::trace
