// libFuzzer target: any bytes through the reader, the op model and the analysis. The only
// acceptable failure is std::invalid_argument (a one-line error for the user); anything else
// escaping, a crash, a hang or a sanitizer report is a bug. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "opfuse/analyze.h"
#include "opfuse/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto rules = opfuse::analyze::default_rules();
  try {
    const auto trace = opfuse::trace::parse_trace(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    opfuse::analyze::analyze(trace, "fuzz", rules, {});
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
