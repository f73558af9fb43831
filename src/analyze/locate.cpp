// Locations (locate.h).
#include "analyze/locate.h"

#include <cctype>

namespace opfuse::analyze {
namespace {

// The innermost call-stack frame outside torch itself: where the user's code called in.
std::string user_frame(const std::string& stack) {
  std::string first;
  for (size_t a = 0; a < stack.size();) {
    size_t b = stack.find(';', a);
    if (b == std::string::npos) b = stack.size();
    size_t x = a, y = b;
    while (x < y && std::isspace(static_cast<unsigned char>(stack[x]))) ++x;
    while (y > x && std::isspace(static_cast<unsigned char>(stack[y - 1]))) --y;
    const std::string frame = stack.substr(x, y - x);
    if (first.empty()) first = frame;
    const bool in_torch = frame.starts_with("torch/") || frame.find("/torch/") != std::string::npos;
    if (!frame.empty() && !in_torch && !frame.starts_with("<built-in")) return frame;
    a = b + 1;
  }
  return first;
}

}  // namespace

uint32_t Locator::location(int32_t e, bool follow_forward) {
  for (int32_t x = e; x >= 0; x = m.op_parent[x])
    if (t.events[x].module != 0) return place(t.events[x].module, as_is);
  if (m.annotation[e] >= 0) return place(t.events[m.annotation[e]].name, as_is);
  for (int32_t x = e; x >= 0; x = m.op_parent[x])
    if (t.events[x].stack != 0) return place(t.events[x].stack, frame);
  if (follow_forward)
    for (int32_t x = e; x >= 0; x = m.op_parent[x])
      if (m.forward[x] >= 0) {
        const uint32_t where = location(m.forward[x], false);
        if (backward.size() <= where) backward.resize(where + 1, -1);
        if (backward[where] < 0) {
          const std::string& w = places[where];
          backward[where] = static_cast<int32_t>(places.intern(w == "(top level)" ? "backward" : w + " (backward)"));
        }
        return static_cast<uint32_t>(backward[where]);
      }
  return places.intern("(top level)");
}

uint32_t Locator::place(uint32_t string_id, std::vector<int32_t>& cache) {
  if (cache.empty()) cache.assign(t.strings.size(), -1);
  int32_t& p = cache[string_id];
  if (p < 0) {
    const std::string& s = t.strings[string_id];
    p = static_cast<int32_t>(places.intern(&cache == &frame ? user_frame(s) : s));
  }
  return static_cast<uint32_t>(p);
}

}  // namespace opfuse::analyze
