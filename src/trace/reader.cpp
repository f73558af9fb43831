// Chrome trace JSON → Trace, with simdjson's on-demand parser: each event's fields are visited
// once, unknown ones skipped unparsed, names interned. Timestamps are read from their text
// (Ascend writes them as decimal strings, Kineto as large numbers) and kept relative to the
// first one, so microsecond fractions survive in a double.
#include <fmt/format.h>
#include <simdjson.h>
#include <zlib.h>

#include <charconv>
#include <cstdlib>
#include <stdexcept>

#include "opfuse/trace.h"

namespace opfuse::trace {
namespace {

using simdjson::ondemand::value;

// A JSON number as an id or count; anything that does not fit is malformed, not undefined.
int64_t to_int64(double d) {
  if (!(d > -9.2e18 && d < 9.2e18)) throw std::invalid_argument(fmt::format("number {} out of range", d));
  return static_cast<int64_t>(d);
}

struct Reader {
  Trace& trace;
  bool have_origin = false;
  int64_t origin_us = 0;  // whole microseconds of the first timestamp

  // "1704161511420306.491" (quoted or not) → microseconds since the first timestamp.
  double timestamp(std::string_view text) {
    if (!text.empty() && text.front() == '"') text = text.substr(1, text.size() - 2);
    const size_t dot = text.find_first_of(".eE");
    if (dot != std::string_view::npos && text[dot] != '.') {  // 1.7e15: rare, and precise enough
      const double d = std::strtod(std::string(text).c_str(), nullptr);
      if (!have_origin) {
        origin_us = to_int64(d);
        have_origin = true;
      }
      return d - static_cast<double>(origin_us);
    }
    int64_t whole = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + (dot == std::string_view::npos ? text.size() : dot), whole);
    if (ec != std::errc()) throw std::invalid_argument(fmt::format("bad timestamp '{}'", text));
    double fraction = 0;
    if (dot != std::string_view::npos) fraction = std::strtod(("0" + std::string(text.substr(dot))).c_str(), nullptr);
    if (!have_origin) {
      origin_us = whole;
      have_origin = true;
    }
    return static_cast<double>(whole - origin_us) + (whole < 0 ? -fraction : fraction);
  }

  double number(value v) {
    if (v.type() == simdjson::ondemand::json_type::string) return std::strtod(std::string(v.get_string().value()).c_str(), nullptr);
    return v.get_double();
  }

  int64_t integer(value v) {
    if (v.type() == simdjson::ondemand::json_type::string) return std::strtoll(std::string(v.get_string().value()).c_str(), nullptr, 10);
    if (v.type() != simdjson::ondemand::json_type::number) return -1;
    return to_int64(v.get_double());
  }

  // A numeric id, or a string one ("stream 7", "CPU functions") interned as −1 − index.
  int64_t id(value v) {
    if (v.type() == simdjson::ondemand::json_type::string) return -1 - static_cast<int64_t>(trace.intern(v.get_string().value()));
    return to_int64(v.get_double());
  }

  void args(simdjson::ondemand::object obj, Event& e, std::string* metadata_name) {
    for (auto field : obj) {
      const std::string_view key = field.unescaped_key();
      value v = field.value();
      if (key == "Sequence number") e.sequence_nr = integer(v);
      else if (key == "External id" || key == "external id") e.external_id = integer(v);
      else if (key == "correlation") e.correlation = integer(v);
      else if (key == "Module Hierarchy") e.module = trace.intern(v.get_string().value());
      else if (key == "name" && metadata_name != nullptr && v.type() == simdjson::ondemand::json_type::string)
        *metadata_name = std::string(v.get_string().value());
    }
  }

  void event(simdjson::ondemand::object obj) {
    Event e;
    std::string metadata_name;
    std::string_view name;
    for (auto field : obj) {
      const std::string_view key = field.unescaped_key();
      value v = field.value();
      if (key == "ph") {
        const std::string_view ph = v.get_string();
        e.phase = ph.empty() ? '?' : ph.front();
      } else if (key == "name") {
        name = v.get_string();
        e.name = trace.intern(name);
      } else if (key == "cat") {
        e.category = trace.intern(v.get_string().value());
      } else if (key == "pid") {
        e.pid = id(v);
      } else if (key == "tid") {
        e.tid = id(v);
      } else if (key == "ts") {
        e.ts = timestamp(v.raw_json_token());
      } else if (key == "dur") {
        e.dur = number(v);
      } else if (key == "id") {
        e.flow_id = id(v);
      } else if (key == "args" && v.type() == simdjson::ondemand::json_type::object) {
        args(v.get_object(), e, &metadata_name);
      }
    }
    if (e.phase == 'M') {
      const std::string& kind = trace.strings[e.name];
      if (kind == "process_name") trace.process_names[e.pid] = metadata_name;
      if (kind == "thread_name") trace.thread_names[e.tid] = metadata_name;
      return;
    }
    if (e.dur < 0) throw std::invalid_argument(fmt::format("event '{}' has negative dur {}", name, e.dur));
    trace.events.push_back(e);
  }
};

bool has_category(const Trace& t, std::initializer_list<const char*> names) {
  for (const Event& e : t.events)
    for (const char* n : names)
      if (t.strings[e.category] == n) return true;
  return false;
}

Dialect detect(const Trace& t, bool opfuse_metadata) {
  if (opfuse_metadata) return Dialect::opfuse;
  for (const auto& [pid, name] : t.process_names)
    if (name == "Ascend Hardware" || name == "CANN") return Dialect::ascend;
  if (has_category(t, {"cpu_op", "kernel", "cuda_runtime", "user_annotation"})) return Dialect::kineto;
  if (has_category(t, {"Operator", "Kernel", "Runtime"})) return Dialect::kineto_legacy_1_8;
  for (const Event& e : t.events)
    if (e.category == 0 && e.pid < 0 && t.strings[-1 - e.pid] == "CPU functions") return Dialect::legacy_profiler;
  return Dialect::unknown;
}

std::string read_file(const std::string& path) {
  // gzread passes plain files through unchanged, so one path reads both.
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::invalid_argument(fmt::format("{}: cannot open", path));
  std::string bytes;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) bytes.append(buf, n);
  int err = Z_OK;
  const char* message = gzerror(f, &err);
  const int64_t offset = static_cast<int64_t>(bytes.size());
  gzclose(f);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
    throw std::invalid_argument(fmt::format("{}: corrupt gzip data after {} bytes ({})", path, offset, message));
  return bytes;
}

}  // namespace

const char* dialect_name(Dialect d) {
  switch (d) {
    case Dialect::kineto: return "PyTorch Kineto";
    case Dialect::kineto_legacy_1_8: return "PyTorch Kineto (torch 1.8-1.9 layout)";
    case Dialect::legacy_profiler: return "PyTorch legacy profiler";
    case Dialect::opfuse: return "opfuse profiler";
    case Dialect::ascend: return "Ascend PyTorch profiler (trace_view.json)";
    case Dialect::unknown: break;
  }
  return "Chrome trace (unrecognised producer)";
}

uint32_t Trace::intern(std::string_view s) {
  auto it = index_.find(std::string(s));
  if (it != index_.end()) return it->second;
  const auto id = static_cast<uint32_t>(strings.size());
  strings.emplace_back(s);
  index_.emplace(strings.back(), id);
  return id;
}

Trace parse_trace(std::string_view json, const std::string& name) {
  Trace trace;
  trace.intern("");
  Reader reader{trace};
  bool opfuse_metadata = false;
  const simdjson::padded_string buffer(json);
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  const char* event_start = buffer.data();
  auto offset = [&] { return static_cast<int64_t>(event_start - buffer.data()); };
  try {
    doc = parser.iterate(buffer);
    auto read_events = [&](simdjson::ondemand::array events) {
      for (auto item : events) {
        if (auto at = doc.current_location(); !at.error()) event_start = at.value();
        reader.event(item.get_object());
      }
    };
    if (doc.type() == simdjson::ondemand::json_type::array) {
      read_events(doc.get_array());
    } else {
      bool found = false;
      for (auto field : doc.get_object()) {
        const std::string_view key = field.unescaped_key();
        if (key == "traceEvents") {
          read_events(field.value().get_array());
          found = true;
        } else if (key == "opfuse") {
          opfuse_metadata = true;
        }
      }
      if (!found) throw std::invalid_argument("no \"traceEvents\" array");
    }
  } catch (const simdjson::simdjson_error& e) {
    throw std::invalid_argument(fmt::format("{}: malformed trace at byte {} ({})", name, offset(), e.what()));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {} at byte {}", name, e.what(), offset()));
  }
  trace.dialect = detect(trace, opfuse_metadata);
  return trace;
}

Trace read_trace(const std::string& path) { return parse_trace(read_file(path), path); }

}  // namespace opfuse::trace
