#include "cli/plugin.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <stdexcept>

namespace opfuse::cli {
namespace {

// The library sits beside the binary, in the build folder or wherever both are installed.
std::string library_path() {
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size());
  exe.resize(n > 0 ? static_cast<size_t>(n) : 0);
  const size_t slash = exe.rfind('/');
  return (slash == std::string::npos ? std::string(".") : exe.substr(0, slash)) + "/libopfuse_commands.so";
}

}  // namespace

void* torch_symbol(const char* name) {
  static void* handle = nullptr;
  if (handle == nullptr) {
    const std::string path = library_path();
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) throw std::runtime_error(fmt::format("{}: cannot load ({})", path, dlerror()));
  }
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) throw std::runtime_error(fmt::format("libopfuse_commands.so: no symbol {}", name));
  return symbol;
}

}  // namespace opfuse::cli
