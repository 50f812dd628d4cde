// Whole-file reads with named errors.
#include "core/io/text_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace hr::core {

std::string read_text_file(const std::string& path, const std::string& tag, const std::string& key) {
  const std::string named = key.empty() ? std::string() : " (" + key + ")";
  std::error_code ec;
  // A directory opens as a stream and fails only when read, with basic_filebuf::underflow's message.
  HR_CHECK(!std::filesystem::is_directory(path, ec), "[", tag, "] ", path, ": is a directory, not a file", named);
  std::ifstream in(path, std::ios::binary);
  HR_CHECK(in, "[", tag, "] ", path, ": cannot open (", std::strerror(errno), ")", named);
  try {
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    throw Error(str("[", tag, "] ", path, ": cannot read (", e.what(), ")", named));
  }
}

}  // namespace hr::core
