// Where results are written: checked before a command does its work, then written in one go.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "opfuse/report.h"

namespace opfuse::report {
namespace fs = std::filesystem;

namespace {

// Why a new file cannot go into `folder`, as an errno, or 0. A regular file in its place is
// "not a directory", though access() would call it "permission denied".
int folder_error(const fs::path& folder) {
  struct stat st {};
  if (stat(folder.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  return access(folder.c_str(), W_OK | X_OK) != 0 ? errno : 0;
}

}  // namespace

bool is_stdout(const std::string& path) { return path == "-"; }

// access() rather than a trial file: nothing is created before the work, and the OS still gives
// its own reason (no such folder, not a folder, permission denied, read-only file system).
void check_output_path(const std::string& path, bool overwrite) {
  if (is_stdout(path)) return;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) throw std::invalid_argument(fmt::format("{}: is a folder, not a file name", path));
  if (fs::exists(status)) {
    if (!overwrite) throw std::invalid_argument(fmt::format("{}: already exists (pass --force to replace it)", path));
    if (access(path.c_str(), W_OK) != 0)
      throw std::invalid_argument(fmt::format("{}: cannot write ({})", path, std::strerror(errno)));
    return;
  }
  const fs::path folder = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (const int error = folder_error(folder); error != 0)
    throw std::invalid_argument(fmt::format("{}: cannot write into {}/ ({})", path, folder.string(), std::strerror(error)));
}

void write_text(const std::string& path, const std::string& text, bool overwrite) {
  if (is_stdout(path)) {
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
      throw std::runtime_error(fmt::format("stdout: write failed ({})", std::strerror(errno)));
    return;
  }
  check_output_path(path, overwrite);
  std::ofstream out(path);
  if (!out) throw std::runtime_error(fmt::format("{}: cannot open for writing ({})", path, std::strerror(errno)));
  out << text;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("{}: write failed ({})", path, std::strerror(errno)));
}

// Invalid UTF-8 (say, in a path) is replaced rather than losing the whole result.
void write_json(const std::string& path, const nlohmann::json& value, bool overwrite) {
  write_text(path, value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", overwrite);
}

}  // namespace opfuse::report
