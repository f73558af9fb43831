// Two parses of one input compared by meaning (strings by text, not by table index): the reader
// tests and the fuzz target hold the chunked path to the one-piece parse with it.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <tuple>

#include "opfuse/trace.h"

namespace opfuse::trace {

// "" when a and b read the same, else the first difference.
inline std::string trace_difference(const Trace& a, const Trace& b) {
  auto id = [](const Trace& t, int64_t v) { return v < 0 ? "'" + t.strings[-1 - v] + "'" : std::to_string(v); };
  auto same = [](double x, double y) { return x == y || (x != x && y != y); };
  if (a.dialect != b.dialect) return fmt::format("dialect {} vs {}", dialect_name(a.dialect), dialect_name(b.dialect));
  if (a.events.size() != b.events.size()) return fmt::format("{} vs {} events", a.events.size(), b.events.size());
  if (a.origin_us != b.origin_us) return fmt::format("origin {} vs {}", a.origin_us, b.origin_us);
  if (a.skipped != b.skipped) return fmt::format("{} vs {} skipped", a.skipped, b.skipped);
  if (a.warnings != b.warnings) return fmt::format("warnings [{}] vs [{}]", fmt::join(a.warnings, "; "), fmt::join(b.warnings, "; "));
  for (size_t i = 0; i < a.events.size(); ++i) {
    const Event &x = a.events[i], &y = b.events[i];
    auto differ = [&](const char* what, const std::string& u, const std::string& v) {
      return fmt::format("event {} {}: {} vs {}", i, what, u, v);
    };
    if (a.strings[x.name] != b.strings[y.name]) return differ("name", a.strings[x.name], b.strings[y.name]);
    if (a.strings[x.category] != b.strings[y.category]) return differ("cat", a.strings[x.category], b.strings[y.category]);
    if (a.strings[x.module] != b.strings[y.module]) return differ("module", a.strings[x.module], b.strings[y.module]);
    if (a.strings[x.dims] != b.strings[y.dims]) return differ("dims", a.strings[x.dims], b.strings[y.dims]);
    if (a.strings[x.types] != b.strings[y.types]) return differ("types", a.strings[x.types], b.strings[y.types]);
    if (a.strings[x.stack] != b.strings[y.stack]) return differ("stack", a.strings[x.stack], b.strings[y.stack]);
    if (x.phase != y.phase || x.binds_enclosing != y.binds_enclosing) return differ("ph", {x.phase}, {y.phase});
    if (id(a, x.pid) != id(b, y.pid)) return differ("pid", id(a, x.pid), id(b, y.pid));
    if (id(a, x.tid) != id(b, y.tid)) return differ("tid", id(a, x.tid), id(b, y.tid));
    if (id(a, x.flow_id) != id(b, y.flow_id)) return differ("flow id", id(a, x.flow_id), id(b, y.flow_id));
    if (!same(x.ts, y.ts)) return differ("ts", fmt::format("{}", x.ts), fmt::format("{}", y.ts));
    if (!same(x.dur, y.dur)) return differ("dur", fmt::format("{}", x.dur), fmt::format("{}", y.dur));
    if (x.sequence_nr != y.sequence_nr || x.external_id != y.external_id || x.correlation != y.correlation)
      return differ("ids", fmt::format("{}/{}/{}", x.sequence_nr, x.external_id, x.correlation),
                    fmt::format("{}/{}/{}", y.sequence_nr, y.external_id, y.correlation));
  }
  for (auto [names, other, what] : {std::tuple{&a.process_names, &b.process_names, "process"},
                                    std::tuple{&a.thread_names, &b.thread_names, "thread"}}) {
    if (names->size() != other->size()) return fmt::format("{} vs {} {} names", names->size(), other->size(), what);
    for (const auto& [key, name] : *names) {
      bool found = false;
      for (const auto& [k, n] : *other) found |= id(a, key) == id(b, k) && n == name;
      if (!found) return fmt::format("{} name {} = '{}' missing", what, id(a, key), name);
    }
  }
  return "";
}

}  // namespace opfuse::trace
