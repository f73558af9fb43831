// Writes a Chrome trace in PyTorch's Kineto layout, one event at a time, to a plain or gzip
// stream — the trace is never built as a whole JSON document in memory.
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "profile/events.h"

namespace opfuse::profile {
namespace {

class Sink {
 public:
  explicit Sink(const std::string& path) : path_(path) {
    gzip_ = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
    if (gzip_) gz_ = gzopen(path.c_str(), "wb6");
    else file_ = std::fopen(path.c_str(), "wb");
    if (gz_ == nullptr && file_ == nullptr) throw std::runtime_error(fmt::format("{}: cannot open for writing", path));
  }
  ~Sink() {
    if (gz_ != nullptr) gzclose(gz_);
    if (file_ != nullptr) std::fclose(file_);
  }
  void put(const std::string& text) {
    const bool ok = gzip_ ? gzwrite(gz_, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size())
                          : std::fwrite(text.data(), 1, text.size(), file_) == text.size();
    if (!ok) throw std::runtime_error(fmt::format("{}: write failed", path_));
  }
  void close() {
    const bool ok = gzip_ ? gzclose(gz_) == Z_OK : std::fclose(file_) == 0;
    gz_ = nullptr;
    file_ = nullptr;
    if (!ok) throw std::runtime_error(fmt::format("{}: write failed", path_));
  }

 private:
  std::string path_;
  bool gzip_ = false;
  gzFile gz_ = nullptr;
  FILE* file_ = nullptr;
};

std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const char* category(EventKind k) { return k == EventKind::user_annotation ? "user_annotation" : "cpu_op"; }

std::string complete_event(const Event& e, int pid, int64_t origin_ns) {
  std::string args = fmt::format("\"External id\": {}", e.external_id);
  if (e.kind != EventKind::user_annotation) {
    args += fmt::format(", \"Input Dims\": {}, \"Input Strides\": {}, \"Input type\": {}", e.input_dims,
                        e.input_strides, e.input_types);
    if (e.sequence_nr >= 0) args += fmt::format(", \"Sequence number\": {}, \"Fwd thread id\": {}", e.sequence_nr, e.forward_tid);
  }
  if (!e.module.empty()) args += ", \"Module Hierarchy\": " + quoted(e.module);
  return fmt::format(
      "{{\"ph\": \"X\", \"cat\": \"{}\", \"name\": {}, \"pid\": {}, \"tid\": {}, \"ts\": {:.3f}, \"dur\": {:.3f}, "
      "\"args\": {{{}}}}}",
      category(e.kind), quoted(e.name), pid, e.tid, (e.start_ns - origin_ns) / 1e3, (e.end_ns - e.start_ns) / 1e3, args);
}

std::string flow_event(char phase, int64_t id, const Event& e, int pid, int64_t origin_ns) {
  return fmt::format(
      "{{\"ph\": \"{}\", \"id\": {}, \"pid\": {}, \"tid\": {}, \"ts\": {:.3f}, \"cat\": \"fwdbwd\", \"name\": \"fwdbwd\"{}}}",
      phase, id, pid, e.tid, (e.start_ns - origin_ns) / 1e3, phase == 'f' ? ", \"bp\": \"e\"" : "");
}

// A backward node's sequence number is the one its forward op took when it created the node;
// the earliest forward op on the forward thread with that number is the one Kineto links.
std::map<std::pair<uint64_t, int64_t>, const Event*> forward_ops_by_sequence(const std::vector<const Event*>& events) {
  std::map<std::pair<uint64_t, int64_t>, const Event*> first;
  for (const Event* e : events) {
    if (e->kind != EventKind::op || e->sequence_nr < 0) continue;
    auto [it, inserted] = first.emplace(std::make_pair(e->tid, e->sequence_nr), e);
    if (!inserted && e->start_ns < it->second->start_ns) it->second = e;
  }
  return first;
}

// Kineto's record of an allocation: an instant event named "[memory]".
std::string memory_event(const Allocation& a, int pid, int64_t origin_ns) {
  return fmt::format(
      "{{\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"s\": \"t\", \"name\": \"[memory]\", \"pid\": {}, \"tid\": {}, "
      "\"ts\": {:.3f}, \"args\": {{\"Total Reserved\": {}, \"Total Allocated\": {}, \"Bytes\": {}, \"Addr\": {}, "
      "\"Device Type\": {}, \"Device Id\": {}}}}}",
      pid, a.tid, (a.ts_ns - origin_ns) / 1e3, a.total_reserved, a.total_allocated, a.bytes, a.addr, a.device_type,
      a.device_index);
}

}  // namespace

void write_trace(const std::string& path, const std::vector<const Event*>& unsorted, const std::vector<Allocation>& unsorted_memory,
                 const nlohmann::json& metadata) {
  std::vector<const Event*> events = unsorted;
  std::stable_sort(events.begin(), events.end(), [](const Event* a, const Event* b) {
    return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;  // parents first
  });
  std::vector<Allocation> memory = unsorted_memory;
  std::stable_sort(memory.begin(), memory.end(), [](const Allocation& a, const Allocation& b) { return a.ts_ns < b.ts_ns; });
  int64_t origin = events.empty() ? 0 : events.front()->start_ns;
  if (!memory.empty()) origin = events.empty() ? memory.front().ts_ns : std::min(origin, memory.front().ts_ns);
  const int pid = static_cast<int>(getpid());

  Sink out(path);
  // A rank of a distributed job says so as Kineto does, so readers (analyze, HTA) tell ranks apart.
  const std::string distributed = metadata.contains("distributedInfo") ? ",\n\"distributedInfo\": " + metadata["distributedInfo"].dump() : "";
  out.put("{\n\"schemaVersion\": 1,\n\"displayTimeUnit\": \"ms\"" + distributed + ",\n\"opfuse\": " +
          metadata.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ",\n\"traceEvents\": [\n");
  out.put(fmt::format("{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {}, \"tid\": 0, \"args\": {{\"name\": \"opfuse\"}}}}", pid));
  std::map<uint64_t, bool> threads;
  for (const Event* e : events) threads[e->tid] = true;
  for (const Allocation& a : memory) threads[a.tid] = true;
  for (const auto& [tid, _] : threads)
    out.put(fmt::format(",\n{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {}, \"tid\": {}, \"args\": {{\"name\": \"thread {}\"}}}}",
                        pid, tid, tid));
  for (const Event* e : events) out.put(",\n" + complete_event(*e, pid, origin));
  for (const Allocation& a : memory) out.put(",\n" + memory_event(a, pid, origin));

  const auto forward = forward_ops_by_sequence(events);
  for (const Event* e : events) {
    if (e->kind != EventKind::backward || e->sequence_nr < 0) continue;
    const auto it = forward.find({e->forward_tid ? e->forward_tid : e->tid, e->sequence_nr});
    if (it == forward.end()) continue;
    out.put(",\n" + flow_event('s', e->sequence_nr, *it->second, pid, origin));
    out.put(",\n" + flow_event('f', e->sequence_nr, *e, pid, origin));
  }
  out.put("\n]\n}\n");
  out.close();
}

}  // namespace opfuse::profile
