// A fresh folder under the system temp dir for one GoogleTest test, removed with everything in it
// when the test ends, so no run leaves files behind.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace opfuse::testing {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("opfuse_" + std::string(info->name()) + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The subfolder name, created.
  std::filesystem::path sub(const std::string& name) const {
    std::filesystem::create_directories(path_ / name);
    return path_ / name;
  }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace opfuse::testing
