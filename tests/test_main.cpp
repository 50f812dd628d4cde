// The tests' main: GoogleTest's, with one scratch directory per test.
//
// ctest runs each test as its own process, two or more at a time (`ctest -j`, the sanitizer pass), and tests
// that wrote the same file name under testing::TempDir() or std::filesystem::temp_directory_path() read each
// other's files. Each test process makes a directory of its own, <base>/hr-test-XXXXXX (mkdtemp), where <base>
// is the TEST_TMPDIR it was given (else TMPDIR, else /tmp), and each test gets <that>/<Suite.Test>/ as
// TEST_TMPDIR (what TempDir() returns) and TMPDIR (what temp_directory_path() and the processes a test starts
// use). A test binary started by a test (a death test's child) inherits its parent's directory through
// HR_TEST_TMPDIR_BASE. The directory of a test that did not fail is removed, and the process's own directory
// when it ends empty, unless HR_KEEP_TEST_TMP is set; a failed test's stays to look at.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

class ScratchPerTest : public testing::EmptyTestEventListener {
 public:
  ScratchPerTest() : base_(env_or("HR_TEST_TMPDIR_BASE", "")), keep_(std::getenv("HR_KEEP_TEST_TMP") != nullptr) {}

  void OnTestStart(const testing::TestInfo& test) override {
    if (base_.empty()) make_base();  // at the first test: listing the tests (ctest's discovery) makes nothing
    std::string name = std::string(test.test_suite_name()) + "." + test.name();
    for (char& c : name)
      if (c == '/') c = '_';  // parameterised suites and tests: Prefix/Suite.Name/3
    dir_ = std::filesystem::path(base_) / name;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    const std::string d = dir_.string() + "/";
    setenv("TEST_TMPDIR", d.c_str(), 1);
    setenv("TMPDIR", d.c_str(), 1);
  }

  // Only the process that made the directories removes them (not a child test process sharing them).
  void OnTestEnd(const testing::TestInfo& test) override {
    std::error_code ec;
    if (owner_ && !keep_ && !test.result()->Failed()) std::filesystem::remove_all(dir_, ec);
    setenv("TEST_TMPDIR", base_.c_str(), 1);
    setenv("TMPDIR", base_.c_str(), 1);
  }

  void OnTestProgramEnd(const testing::UnitTest&) override {
    std::error_code ec;
    if (owner_ && !keep_) std::filesystem::remove(base_, ec);  // only when empty: no test failed
  }

 private:
  void make_base() {
    std::string pattern = env_or("TEST_TMPDIR", env_or("TMPDIR", "/tmp")) + "/hr-test-XXXXXX";
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(pattern).parent_path(), ec);
    if (mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "test_main: cannot make a scratch directory like %s\n", pattern.c_str());
      std::exit(2);
    }
    base_ = pattern;
    owner_ = true;
    setenv("HR_TEST_TMPDIR_BASE", base_.c_str(), 1);
  }

  std::string base_;
  bool owner_ = false, keep_;
  std::filesystem::path dir_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new ScratchPerTest);
  return RUN_ALL_TESTS();
}
