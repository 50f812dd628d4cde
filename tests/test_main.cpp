// The tests' main: GoogleTest's, with one scratch directory per test.
//
// ctest runs each test as its own process, two or more at a time (`ctest -j`, the sanitizer pass), and tests
// that wrote the same file name under testing::TempDir() or std::filesystem::temp_directory_path() read each
// other's files. Each test now gets <base>/<Suite.Test>/ as TEST_TMPDIR (what TempDir() returns) and TMPDIR
// (what temp_directory_path() and the processes a test starts use), where <base> is the TEST_TMPDIR the
// process was given (else TMPDIR, else /tmp). The directory of a test that passed is removed unless
// HR_KEEP_TEST_TMP is set; a failed test's stays to look at.
#include <gtest/gtest.h>

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
  // The base is passed on to the processes a test starts (HR_TEST_TMPDIR_BASE): a test binary started as an
  // MPI rank or a child finds its parent's directory, not one inside it.
  ScratchPerTest()
      : base_(env_or("HR_TEST_TMPDIR_BASE", env_or("TEST_TMPDIR", env_or("TMPDIR", "/tmp")))),
        owner_(std::getenv("HR_TEST_TMPDIR_BASE") == nullptr && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
    setenv("HR_TEST_TMPDIR_BASE", base_.c_str(), 1);
  }

  void OnTestStart(const testing::TestInfo& test) override {
    std::string name = std::string(test.test_suite_name()) + "." + test.name();
    for (char& c : name)
      if (c == '/') c = '_';  // parameterised suites and tests: Prefix/Suite.Name/3
    dir_ = std::filesystem::path(base_) / name;
    std::filesystem::create_directories(dir_);
    const std::string d = dir_.string() + "/";
    setenv("TEST_TMPDIR", d.c_str(), 1);
    setenv("TMPDIR", d.c_str(), 1);
  }

  // Only the process that made the directory removes it (not MPI ranks sharing it, nor child test processes).
  void OnTestEnd(const testing::TestInfo& test) override {
    if (owner_ && test.result()->Passed() && std::getenv("HR_KEEP_TEST_TMP") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
    setenv("TEST_TMPDIR", base_.c_str(), 1);
    setenv("TMPDIR", base_.c_str(), 1);
  }

 private:
  std::string base_;
  bool owner_;
  std::filesystem::path dir_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new ScratchPerTest);
  return RUN_ALL_TESTS();
}
