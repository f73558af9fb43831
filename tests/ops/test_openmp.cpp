// One OpenMP runtime in a C++ process running an opfuse op: the libgomp pip's torch ships, which
// opfuse's objects link (cmake/torch.cmake), and no second one from the compiler.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "opfuse/ops.h"

namespace {

std::set<std::string> openmp_runtimes() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> found;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::filesystem::path path = line.substr(slash);
    const std::string name = path.filename();
    for (const char* runtime : {"libgomp", "libomp", "libiomp"})
      if (name.find(runtime) != std::string::npos) found.insert(std::filesystem::canonical(path));
  }
  return found;
}

TEST(OpenMP, OneRuntimeTorchsOwn) {
  at::set_num_threads(2);
  const at::Tensor x = torch::randn({1 << 22});
  opfuse::silu(x);  // large enough for at::parallel_for to open a parallel region
  const std::set<std::string> runtimes = openmp_runtimes();
  ASSERT_EQ(runtimes.size(), 1u) << ::testing::PrintToString(runtimes);
  EXPECT_NE(runtimes.begin()->find("/torch/lib/libgomp"), std::string::npos) << *runtimes.begin();
}

}  // namespace
