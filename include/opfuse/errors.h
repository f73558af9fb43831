// What an error says, in the one line a user reads.
#pragma once

#include <string>

namespace opfuse {

// An error's first line (a C++ backtrace may follow it); for the TorchScript interpreter's
// report, whose first line is only "The following operation failed in the TorchScript
// interpreter." and whose cause comes last after the serialized code's traceback, that cause.
inline std::string error_summary(const std::string& what) {
  const bool interpreter = what.find("TorchScript interpreter") != std::string::npos;
  const size_t cause = what.rfind("Error: ");
  std::string line = interpreter && cause != std::string::npos ? what.substr(what.rfind('\n', cause) + 1) : what;
  line = line.substr(0, line.find('\n'));
  return line;
}

}  // namespace opfuse
