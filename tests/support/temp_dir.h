// Test support: a fresh directory under /tmp for one test, removed at the
// end unless the test failed or TETHER_KEEP_TEST_FILES is set (then kept,
// and named in the output, for inspection).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace tether::testing {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/tether-test-XXXXXX";
    char* made = mkdtemp(pattern);
    EXPECT_NE(made, nullptr) << "mkdtemp failed";
    path_ = made ? made : "/tmp";
  }
  ~TempDir() {
    if (::testing::Test::HasFailure() ||
        getenv("TETHER_KEEP_TEST_FILES") != nullptr) {
      std::cerr << "test files kept in " << path_ << "\n";
      return;
    }
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tether::testing
