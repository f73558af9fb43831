// Each event's fields are visited once, unknown ones skipped unparsed, names interned.
// Timestamps are read from their text (Ascend writes them as decimal strings, Kineto as large
// numbers) and kept relative to the first one (or to a given origin), so microsecond fractions
// survive in a double.
// Compiled twice (see CMakeLists.txt): OPFUSE_KERNEL names the instruction set.
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "trace/document.h"

namespace opfuse::trace::detail {
namespace OPFUSE_KERNEL {
namespace {

using simdjson::ondemand::json_type;
using simdjson::ondemand::value;

constexpr size_t kMaxWarnings = 5;

// A field's key compared in place, without unescaping it (trace keys are never escaped); the
// buffer's padding makes reading a few bytes past a short key safe.
struct Key {
  const char* raw;
  bool operator==(std::string_view k) const { return std::memcmp(raw, k.data(), k.size()) == 0 && raw[k.size()] == '"'; }
};

// opfuse's metadata: {"memory_before": {"parameters": bytes, …}}, what the model held as the
// profile began, which the allocations in the trace cannot show; "plain_step_ms", the step's time
// unprofiled just before, which shows what profiling added; "profiler": "torch.profiler", the
// trace is torch.profiler's (Kineto's) with opfuse's metadata added, not opfuse's profiler's.
// Anything else there is ignored.
void read_opfuse_metadata(value meta, TopLevel& top) {
  if (meta.type() != json_type::object) return;
  for (auto field : meta.get_object()) {
    const std::string_view key = field.unescaped_key().value();
    value v = field.value();
    if (key == "profiler" && v.type() == json_type::string && v.get_string().value() == "torch.profiler")
      top.opfuse = false;
    if (key == "plain_step_ms" && v.type() == json_type::number) {
      const double ms = v.get_double();
      if (ms > 0 && ms < 1e9) top.plain_step_us = 1000 * ms;
    }
    if (key != "memory_before" || v.type() != json_type::object) continue;
    for (auto part : v.get_object()) {
      const std::string what(part.unescaped_key().value());
      value n = part.value();
      if (n.type() != json_type::number) continue;
      const double bytes = n.get_double();
      if (bytes >= 0 && bytes < 9e18) top.memory_before.emplace_back(what, static_cast<int64_t>(bytes));
    }
  }
}

// "distributedInfo": {"rank": N, …}'s rank, or -1 when it has none a number can say.
int64_t rank_of(value info) {
  if (info.type() != json_type::object) return -1;
  for (auto field : info.get_object()) {
    if (field.unescaped_key().value() != "rank") continue;
    value v = field.value();
    if (v.type() != json_type::number) return -1;
    const double r = v.get_double();
    return r >= 0 && r < 1e9 && r == static_cast<int64_t>(r) ? static_cast<int64_t>(r) : -1;
  }
  return -1;
}

// An event the reader cannot use; it is skipped, not fatal.
struct BadEvent : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A JSON number as an id or count; anything that does not fit is malformed, not undefined.
int64_t to_int64(double d) {
  if (!(d > -9.2e18 && d < 9.2e18)) throw BadEvent(fmt::format("number {} out of range", d));
  return static_cast<int64_t>(d);
}

// a − b; timestamps too far apart for that are malformed, not undefined.
int64_t microseconds_between(int64_t a, int64_t b) {
  int64_t d = 0;
  if (__builtin_sub_overflow(a, b, &d)) throw BadEvent(fmt::format("timestamp {} too far from the origin {}", a, b));
  return d;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

double parse_double(std::string_view text) {
  double d = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
  if (ec != std::errc() || end != text.data() + text.size()) throw BadEvent(fmt::format("'{}' is not a number", text));
  return d;
}

// [[4, 3, 64, 64], [], [16]] → "4,3,64,64;;16"; nested lists (TensorList inputs) become "*".
void join_dims(simdjson::ondemand::array inputs, std::string& out) {
  out.clear();
  bool first_input = true;
  for (auto input : inputs) {
    if (!first_input) out += ';';
    first_input = false;
    value in = input.value();
    if (in.type() != json_type::array) continue;
    bool first_dim = true;
    for (auto dim : in.get_array()) {
      if (!first_dim) out += ',';
      first_dim = false;
      value d = dim.value();
      if (d.type() != json_type::number) {
        out += '*';
        continue;
      }
      char digits[24];
      const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, to_int64(d.get_double()));
      out.append(digits, end);
    }
  }
}

// ["Float", "Scalar", ""] → "Float;Scalar;".
void join_types(simdjson::ondemand::array items, std::string& out) {
  out.clear();
  bool first = true;
  for (auto item : items) {
    if (!first) out += ';';
    first = false;
    value t = item.value();
    if (t.type() == json_type::string) out += t.get_string().value();
  }
}

// "Input Dims" and "Input type" repeat the same few hundred arrays across a whole trace, so each
// array's raw text is normalised once per thread and remembered: the normal form depends on the
// text alone. An entry also keeps its string id in the chunk that last used it, so a repeat
// within a chunk costs one hash of the raw text.
class RawCache {
 public:
  using Join = void (*)(simdjson::ondemand::array, std::string&);
  explicit RawCache(Join join) : join_(join) {}

  uint32_t id(std::string_view raw, Trace& trace, uint64_t chunk) {
    if (raws_.size() > kMaxEntries) *this = RawCache(join_);
    const uint32_t k = raws_.intern(raw);
    if (k == entries_.size()) entries_.emplace_back();
    Entry& e = entries_[k];
    if (!e.ready) normalise(raw, e);
    if (!e.bad.empty()) throw BadEvent(e.bad);
    if (e.chunk != chunk) e.chunk = chunk, e.id = trace.intern(e.normal);
    return e.id;
  }

 private:
  static constexpr size_t kMaxEntries = 1 << 16;
  struct Entry {
    bool ready = false;
    std::string normal, bad;  // bad: why an event with this array is skipped
    uint64_t chunk = 0;
    uint32_t id = 0;
  };

  // The array parsed on its own, as the reader would have parsed it in place. A malformed one
  // throws simdjson's error, which fails the document as it would have anyway.
  void normalise(std::string_view raw, Entry& e) {
    thread_local simdjson::ondemand::parser parser;
    const simdjson::padded_string text(raw);
    simdjson::ondemand::document doc = parser.iterate(text);
    try {
      join_(doc.get_array(), e.normal);
    } catch (const BadEvent& why) {
      e.bad = why.what();
    }
    e.ready = true;
  }

  Join join_;
  Strings raws_;
  std::vector<Entry> entries_ = std::vector<Entry>(1);  // as raws_, which starts with ""
};

std::atomic<uint64_t> next_chunk{1};

// "491" after the point → 0.491: the digits as an integer over a power of ten, one rounding.
double decimal_fraction(std::string_view digits) {
  static constexpr double kPowers[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                       1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18};
  if (digits.empty()) return 0;
  if (digits.size() > 18) digits = digits.substr(0, 18);  // beyond a double's precision anyway
  uint64_t n = 0;
  for (char c : digits) n = n * 10 + static_cast<uint64_t>(c - '0');
  return static_cast<double>(n) / kPowers[digits.size()];
}

// A field's previous text and its id: consecutive events often repeat a category, a module
// or an input list, and a repeat then costs one comparison instead of a hash and a probe. The
// text points into this document's buffers, so a memo lives no longer than its Reader.
struct Memo {
  std::string_view text;
  uint32_t id = 0;
  bool known = false;

  template <typename Intern>
  uint32_t operator()(std::string_view s, Intern intern) {
    if (known && s.size() == text.size() && std::memcmp(s.data(), text.data(), s.size()) == 0) return id;
    id = intern(s);  // first, so a throw leaves the memo as it was
    text = s, known = true;
    return id;
  }
};

struct Reader {
  Reader(Trace& t, bool origin_known) : trace(t), have_origin(origin_known) {}

  Trace& trace;
  bool have_origin;
  uint64_t chunk = next_chunk++;  // names this parse in the raw caches
  Memo name_memo, category_memo, module_memo, stack_memo, dims_memo, types_memo;

  // "1704161511420306.491" (quoted or not) → microseconds since the origin: the whole part is
  // subtracted as an integer, then the fraction added, so it keeps its digits.
  double timestamp(value v) {
    std::string_view text;
    if (v.type() == json_type::string) text = v.get_string();
    else if (v.type() == json_type::number) text = v.raw_json_token();
    else throw BadEvent("ts is not a number");
    while (!text.empty() && (text.back() == ' ' || text.back() == ',' || text.back() == '\n' || text.back() == '\r' ||
                             text.back() == '\t' || text.back() == '}' || text.back() == ']'))
      text.remove_suffix(1);
    const size_t dot = text.find_first_of(".eE");
    std::string_view digits;  // of the fraction
    if (dot != std::string_view::npos && text[dot] == '.') {
      digits = text.substr(dot + 1);
      digits = digits.substr(0, std::find_if_not(digits.begin(), digits.end(), is_digit) - digits.begin());
    }
    if (dot != std::string_view::npos && dot + 1 + digits.size() != text.size()) {  // not digits[.digits]
      if (text.find_first_of("eE", dot) == std::string_view::npos)
        throw BadEvent(fmt::format("bad timestamp '{}'", text));
      const double d = parse_double(text);  // 1.7e15: rare, and precise enough
      if (!have_origin) set_origin(to_int64(d));
      return d - static_cast<double>(trace.origin_us);
    }
    int64_t whole = 0;
    const char* whole_end = text.data() + (dot == std::string_view::npos ? text.size() : dot);
    const auto [end, ec] = std::from_chars(text.data(), whole_end, whole);
    if (ec != std::errc() || end != whole_end) throw BadEvent(fmt::format("bad timestamp '{}'", text));
    const double fraction = decimal_fraction(digits);
    if (!have_origin) set_origin(whole);
    const int64_t since = microseconds_between(whole, trace.origin_us);
    return static_cast<double>(since) + (text.front() == '-' ? -fraction : fraction);
  }

  void set_origin(int64_t us) {
    trace.origin_us = us;
    have_origin = true;
  }

  double number(value v) {
    if (v.type() == json_type::string) return parse_double(v.get_string().value());
    if (v.type() != json_type::number) throw BadEvent("dur is not a number");
    return v.get_double();
  }

  int64_t integer(value v) {
    if (v.type() == json_type::string) return std::strtoll(std::string(v.get_string().value()).c_str(), nullptr, 10);
    if (v.type() != json_type::number) return -1;
    return to_int64(v.get_double());
  }

  // A numeric id, or a string one ("stream 7", "CPU functions") interned as −1 − index. Negative
  // ids name strings, so a negative number is interned as its decimal text.
  int64_t id(value v) {
    if (v.type() == json_type::string) return string_id(v.get_string().value());
    if (v.type() != json_type::number) throw BadEvent("pid/tid is neither a number nor a string");
    const int64_t n = to_int64(v.get_double());
    if (n >= 0) return n;
    char digits[24];
    const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, n);
    return string_id(std::string_view(digits, end - digits));
  }

  int64_t string_id(std::string_view s) { return -1 - static_cast<int64_t>(trace.intern(s)); }

  uint32_t intern(std::string_view s, Memo& memo) {
    return memo(s, [this](std::string_view text) { return trace.intern(text); });
  }

  uint32_t string(value v, Memo& memo) {
    if (v.type() != json_type::string) return 0;
    return intern(v.get_string().value(), memo);
  }

  uint32_t dims(value v) { return cached(v, dims_cache(), dims_memo); }
  uint32_t types(value v) { return cached(v, types_cache(), types_memo); }

  static RawCache& dims_cache() {
    thread_local RawCache cache(join_dims);
    return cache;
  }
  static RawCache& types_cache() {
    thread_local RawCache cache(join_types);
    return cache;
  }
  uint32_t cached(value v, RawCache& cache, Memo& memo) {
    if (v.type() != json_type::array) return 0;
    simdjson::ondemand::array a = v.get_array();
    return memo(a.raw_json().value(), [&](std::string_view raw) { return cache.id(raw, trace, chunk); });
  }

  // Only the innermost frames locate an op; Ascend separates frames with ";\r\n".
  uint32_t stack(value v) {
    if (v.type() != json_type::string) return 0;
    std::string_view s = v.get_string();
    size_t end = 0;
    for (int frames = 0; frames < 6 && end != std::string_view::npos; ++frames) end = s.find(';', end + (frames > 0));
    return intern(s.substr(0, end), stack_memo);
  }

  void args(simdjson::ondemand::object obj, Event& e, std::string* metadata_name, Allocation& memory) {
    for (auto field : obj) {
      const Key key{field.key().value().raw()};
      value v = field.value();
      if (key == "Sequence number") e.sequence_nr = integer(v);
      else if (key == "External id" || key == "external id") e.external_id = integer(v);
      else if (key == "correlation") e.correlation = integer(v);
      else if (key == "Module Hierarchy") e.module = string(v, module_memo);
      else if (key == "Input Dims") e.dims = dims(v);
      else if (key == "Input Strides") e.strides = dims(v);  // the same arrays of integers
      else if (key == "Input type") e.types = types(v);
      else if (key == "Call stack") e.stack = stack(v);
      else if (key == "name" && metadata_name != nullptr && v.type() == json_type::string)
        *metadata_name = std::string(v.get_string().value());
      else if (key == "Bytes") memory.bytes = integer(v);
      else if (key == "Addr") memory.addr = integer(v);
      else if (key == "Total Allocated") memory.total_allocated = integer(v);
      else if (key == "Total Reserved") memory.total_reserved = integer(v);
      else if (key == "Device Type") memory.device_type = integer(v);
      else if (key == "Device Id") memory.device_id = integer(v);
    }
  }

  // Returns false (with the reason) for an event to skip; the JSON itself was well formed.
  void event(simdjson::ondemand::object obj) {
    Event e;
    Allocation memory;
    std::string metadata_name;
    bool has_ts = false;
    std::string bad;
    for (auto field : obj) {
      const Key key{field.key().value().raw()};
      value v = field.value();
      try {
        if (key == "ph") {
          if (v.type() != json_type::string) throw BadEvent("ph is not a string");
          const std::string_view ph = v.get_string();
          e.phase = ph.empty() ? '?' : ph.front();
        } else if (key == "name") {
          e.name = string(v, name_memo);
        } else if (key == "cat") {
          e.category = string(v, category_memo);
        } else if (key == "pid") {
          e.pid = id(v);
        } else if (key == "tid") {
          e.tid = id(v);
        } else if (key == "ts") {
          e.ts = timestamp(v);
          has_ts = true;
        } else if (key == "dur") {
          e.dur = number(v);
          if (!(e.dur >= 0)) throw BadEvent(fmt::format("negative dur {}", e.dur));
        } else if (key == "id") {
          e.flow_id = id(v);
        } else if (key == "bp") {
          e.binds_enclosing = v.type() == json_type::string && v.get_string().value() == "e";
        } else if (key == "args" && v.type() == json_type::object) {
          args(v.get_object(), e, &metadata_name, memory);
        }
      } catch (const BadEvent& why) {
        if (bad.empty()) bad = why.what();
      }
    }
    if (e.phase == 'M') return metadata(e, metadata_name);
    if (bad.empty() && !has_ts) bad = "no ts";
    if (!bad.empty()) throw BadEvent(bad);
    if (e.phase == 'i' && trace.strings[e.name] == "[memory]") {
      memory.ts = e.ts, memory.pid = e.pid, memory.tid = e.tid;
      trace.memory.push_back(memory);
      return;
    }
    trace.events.push_back(e);
  }

  void metadata(const Event& e, const std::string& name) {
    const std::string& kind = trace.strings[e.name];
    if (kind == "process_name") trace.process_names[e.pid] = name;
    if (kind == "thread_name") trace.thread_names[e.tid] = name;
  }
};

// Where the first byte that is not UTF-8 is (simdjson only says that there is one).
int64_t invalid_utf8_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size() || !simdjson::validate_utf8(s.data() + i, n)) return static_cast<int64_t>(i);
    i += n;
  }
  return static_cast<int64_t>(s.size());
}

// How a document that failed to parse ends: inside a string, inside an array or object, or
// closed. Only read on the error path: a cut file fails at its end, but simdjson's on-demand
// parser reports an unclosed string before it reads anything (at byte 0), and an unclosed
// array at wherever its iterator stood.
enum class Ending { closed, in_string, in_container };

Ending ending_of(std::string_view s) {
  bool in_string = false, escaped = false;
  int64_t depth = 0;
  for (const char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return in_string ? Ending::in_string : depth > 0 ? Ending::in_container : Ending::closed;
}

// The errors simdjson gives for a document that stops early; checked against how it ends, so a
// stray brace in the middle is still reported where it is.
bool is_truncation(simdjson::error_code error) {
  return error == simdjson::UNCLOSED_STRING || error == simdjson::INCOMPLETE_ARRAY_OR_OBJECT ||
         error == simdjson::TAPE_ERROR;
}

}  // namespace

Trace parse(Document& in) {
  Trace trace;
  trace.events.reserve(in.json.size() / 160);  // about the smallest event a profiler writes
  Reader reader{trace, in.has_origin};
  trace.origin_us = in.origin_us;
  thread_local simdjson::ondemand::parser parser;  // its buffers are reused chunk after chunk
  simdjson::ondemand::document doc;
  const char* event_start = in.json.data();
  auto offset = [&] { return in.base + static_cast<int64_t>(event_start - in.json.data()); };
  try {
    doc = parser.iterate(simdjson::padded_string_view(in.json.data(), in.json.size(), in.json.size() + simdjson::SIMDJSON_PADDING));
    auto read_events = [&](simdjson::ondemand::array events) {
      for (auto item : events) {
        ++in.entries;
        if (auto at = doc.current_location(); !at.error()) event_start = at.value();
        try {
          reader.event(item.get_object());
        } catch (const BadEvent& why) {
          ++trace.skipped;
          if (trace.warnings.size() < kMaxWarnings)
            trace.warnings.push_back(fmt::format("{}: event skipped: {} at byte {}", in.name, why.what(), offset()));
        }
      }
    };
    if (doc.type() == json_type::array) {
      read_events(doc.get_array());
    } else {
      bool found = false;
      for (auto field : doc.get_object()) {
        const std::string_view key = field.unescaped_key();
        if (key == "traceEvents") {
          read_events(field.value().get_array());
          found = true;
        } else if (key == "opfuse") {
          in.top.opfuse = true;
          read_opfuse_metadata(field.value(), in.top);
        } else if (key == "distributedInfo") {
          in.top.rank = rank_of(field.value());
        }
      }
      if (!found) throw std::invalid_argument("no \"traceEvents\" array");
    }
    if (auto at = doc.current_location(); !at.error()) {
      event_start = at.value();
      throw std::invalid_argument("more JSON after the end of the document");
    }
    in.has_origin = reader.have_origin;
    in.origin_us = trace.origin_us;
  } catch (const simdjson::simdjson_error& e) {
    if (e.error() == simdjson::UTF8_ERROR) event_start = in.json.data() + invalid_utf8_offset(in.json);
    const Ending ending = is_truncation(e.error()) ? ending_of(in.json) : Ending::closed;
    if (ending != Ending::closed)
      throw std::invalid_argument(fmt::format("{}: truncated at byte {} (the file ends inside {})", in.name,
                                              in.base + static_cast<int64_t>(in.json.size()),
                                              ending == Ending::in_string ? "a string" : "an unclosed array or object"));
    throw std::invalid_argument(fmt::format("{}: malformed trace at byte {} ({})", in.name, offset(), e.what()));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {} at byte {}", in.name, e.what(), offset()));
  }
  return trace;
}

}  // namespace OPFUSE_KERNEL

Trace OPFUSE_ENTRY(Document& doc) { return OPFUSE_KERNEL::parse(doc); }

}  // namespace opfuse::trace::detail
