// libFuzzer target: any bytes through the reader, the op model and the analysis. The only
// acceptable failure is std::invalid_argument (a one-line error for the user); anything else
// escaping, a crash, a hang or a sanitizer report is a bug. Every input is also read through the
// chunked path with tiny chunks, which must read exactly what the one-piece parse reads (or
// reject it with the same error); a difference aborts. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../trace/trace_diff.h"
#include "opfuse/analyze.h"
#include "opfuse/trace.h"
#include "trace/chunked.h"

namespace {

// The trace, or the error it was rejected with.
template <typename Parse>
std::optional<opfuse::trace::Trace> read(Parse parse, std::string& error) {
  try {
    return parse();
  } catch (const std::invalid_argument& e) {
    error = e.what();
    return std::nullopt;
  }
}

[[noreturn]] void differ(const std::string& what) {
  std::fprintf(stderr, "fuzz: chunked and whole parses differ: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto rules = opfuse::analyze::default_rules();
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  const size_t chunk_bytes = 1 + size % 48;  // from one event per chunk to a few
  std::string whole_error, chunked_error;
  const auto whole = read([&] { return opfuse::trace::parse_trace(json, "fuzz"); }, whole_error);
  const auto chunked =
      read([&] { return opfuse::trace::detail::parse_trace_chunked(json, "fuzz", chunk_bytes); }, chunked_error);
  if (whole_error != chunked_error) differ("error '" + whole_error + "' vs '" + chunked_error + "'");
  if (!whole) return 0;
  if (const std::string d = opfuse::trace::trace_difference(*whole, *chunked); !d.empty()) differ(d);
  try {
    opfuse::analyze::analyze(*whole, "fuzz", rules, {});
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
