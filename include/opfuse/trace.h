// One Trace type, whatever wrote the Chrome trace: PyTorch Kineto (2.x and the 1.8-era
// layout), the legacy profiler, opfuse's own profiler, or the Ascend profiler's trace_view.json.
// The reader keeps only what analysis needs: interned names and compact records.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace opfuse::trace {

enum class Dialect { kineto, kineto_legacy_1_8, legacy_profiler, opfuse, ascend, unknown };
const char* dialect_name(Dialect d);

struct Event {
  uint32_t name = 0, category = 0;  // indices into Trace::strings
  uint32_t module = 0;              // "Module Hierarchy" (0: none)
  uint32_t dims = 0;                // "Input Dims" as "4,3,64,64;;" (inputs split by ';')
  uint32_t strides = 0;             // "Input Strides", written as dims are (0: not recorded)
  uint32_t types = 0;               // "Input type" as "float;float"
  uint32_t stack = 0;               // the first frames of "Call stack", split by ';'
  char phase = 'X';                 // X, B, E, s, f, i, C
  bool binds_enclosing = false;     // a flow end with bp:"e": binds to the slice around it
  int64_t pid = 0, tid = 0;         // string pids/tids ("stream 7") are interned: −1 − string index
  double ts = 0, dur = 0;           // microseconds since Trace::origin_us
  int64_t sequence_nr = -1, external_id = -1, correlation = -1, flow_id = -1;
};

// An allocation (bytes > 0) or a free (bytes < 0) as a profiler records it with its memory
// profiling on (Kineto's "[memory]" instant events), with the allocator's totals just after it.
// A CPU allocator counts only what it was asked for while the profile ran.
struct Allocation {
  double ts = 0;                // microseconds since Trace::origin_us
  int64_t pid = 0, tid = 0;     // the thread that allocated or freed
  int64_t addr = 0, bytes = 0;
  int64_t total_allocated = -1, total_reserved = -1;  // −1: not recorded
  int64_t device_type = 0, device_id = -1;            // c10::DeviceType (0: CPU, 1: CUDA …)
};

// Interned strings: index 0 is the empty string; indices stay valid as the table grows.
class Strings {
 public:
  Strings();
  uint32_t intern(std::string_view s);
  const std::string& operator[](size_t i) const { return strings_[i]; }
  size_t size() const { return strings_.size(); }

 private:
  void grow();
  std::deque<std::string> strings_;  // a deque: references handed out must not move
  std::vector<uint64_t> slots_;      // open addressing: hash tag | string index + 1, 0 when empty
};

struct Trace {
  Dialect dialect = Dialect::unknown;
  Strings strings;
  std::vector<Event> events;  // every non-metadata event but allocations, in file order
  std::vector<Allocation> memory;  // the "[memory]" events, in file order
  // opfuse's profiler: bytes the model held as the profile began, by what ("parameters",
  // "gradients", "optimizer state", "inputs"), which no allocation in the trace shows.
  std::vector<std::pair<std::string, int64_t>> memory_before;
  // opfuse's profiler: the median step just before the profile, unprofiled (0: not known).
  double plain_step_us = 0;
  std::unordered_map<int64_t, std::string> process_names, thread_names;
  int64_t origin_us = 0;      // the first timestamp in the file, whole microseconds
  int64_t skipped = 0;        // events dropped as unusable (bad ts, dur …), each with a warning
  std::vector<std::string> warnings;  // the first few, "PATH: … at byte N"
  int chunks = 1;             // pieces the file was parsed in, in parallel
  int64_t rank = -1;          // the process's rank in a distributed job ("distributedInfo"), or -1

  const std::string& name(const Event& e) const { return strings[e.name]; }
  uint32_t intern(std::string_view s) { return strings.intern(s); }
};

// Reads PATH (.json or .json.gz; a JSON array of events or an object with "traceEvents").
// Large files are parsed on all cores. Throws std::invalid_argument "PATH: <what> at byte N"
// for unreadable or malformed input.
Trace read_trace(const std::string& path);
// The same from bytes already in memory; `name` only labels errors.
Trace parse_trace(std::string_view json, const std::string& name);

}  // namespace opfuse::trace

namespace opfuse::trace {

// What an event is, across dialects.
enum class Kind : uint8_t {
  op,          // a host operator: cpu_op, Operator, legacy profiler rows, Optimizer.step#…
  annotation,  // user_annotation (opfuse's module scopes, record_function)
  step,        // ProfilerStep#N
  device,      // a kernel, memcpy/memset, Ascend device task or MTIA CCP event
  runtime,     // cudaLaunchKernel and friends, CANN API calls
  flow,        // s / f / t flow ends
  other,       // python_function frames, counters, anything else
  summary,     // a profiler's own summary lane (Ascend's "Overlap Analysis": Computing, Free, …)
};

// The relations analysis walks, built once from nesting, flows and ids. Indices are event
// indices into Trace::events; −1 means none.
struct Links {
  std::vector<Kind> kind;
  std::vector<int32_t> parent;       // the enclosing slice on the same thread
  std::vector<int32_t> op_parent;    // the nearest enclosing op
  std::vector<int32_t> annotation;   // the nearest enclosing annotation (not a step)
  std::vector<int32_t> launcher;     // per device event: the host op that launched it
  std::vector<int32_t> queued_call;  // per device event an op queued on Ascend's task queue: the call
                                     // the queue thread ran for it (aclnn*), or −1; empty without a queue
  std::vector<int32_t> forward;      // per backward op: the forward op it differentiates
  std::vector<std::vector<int32_t>> threads;  // per host thread: its top-level ops, in time order
  std::vector<int32_t> child_begin;  // op children of op e: children[child_begin[e] .. child_begin[e+1])
  std::vector<int32_t> children;
  std::vector<int32_t> steps;        // ProfilerStep#N slices, in time order
  std::vector<std::vector<int32_t>> device_lanes;  // per device stream: its events, in time order
  std::vector<std::vector<int32_t>> launch_calls;  // per device lane and event: the runtime call with its
                                                   // correlation id (cudaLaunchKernel …), or −1
  std::vector<std::vector<int32_t>> summary_lanes; // per summary lane (one per thread): its slices, in time order
  int64_t overlapping = 0;           // slices that overlap a sibling without nesting: left out of trees

  size_t child_count(int32_t e) const { return child_begin[e + 1] - child_begin[e]; }
  const int32_t* children_of(int32_t e) const { return children.data() + child_begin[e]; }
};

Links build_links(const Trace& trace);

}  // namespace opfuse::trace
