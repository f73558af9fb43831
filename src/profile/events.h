// The profiler's compact record of one operator, backward node or user scope.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace opfuse::profile {

enum class EventKind { op, backward, user_annotation };

struct Event {
  std::string name;
  int64_t start_ns = 0, end_ns = 0;
  uint64_t tid = 0, forward_tid = 0;
  int64_t sequence_nr = -1, external_id = 0;
  EventKind kind = EventKind::op;
  std::string input_dims, input_strides, input_types;  // JSON arrays, already formatted
  std::string module;                   // innermost enclosing module scope, or empty
};

// One allocation (bytes > 0) or free (bytes < 0) an allocator reported, with its totals after it.
struct Allocation {
  int64_t ts_ns = 0;
  uint64_t tid = 0, addr = 0;
  int64_t bytes = 0, total_allocated = 0, total_reserved = 0;
  int device_type = 0, device_index = -1;  // c10::DeviceType; the device's index (−1: none, as on the CPU)
};

// Streams events and allocations as a Kineto-layout Chrome trace (see trace_writer.cpp).
void write_trace(const std::string& path, const std::vector<const Event*>& events, const std::vector<Allocation>& memory,
                 const nlohmann::json& metadata);

}  // namespace opfuse::profile
