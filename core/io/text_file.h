// Reading a whole file a user names (a config, a DeepSpeed JSON, a data set) with errors that name it: a missing
// file, a directory given for a file, and a failed read each say which path and, when given, which key named it.
#pragma once

#include <string>

namespace hr::core {

// The bytes of `path`. Errors read "[tag] PATH: is a directory, not a file (KEY)"; `key` may be empty.
std::string read_text_file(const std::string& path, const std::string& tag, const std::string& key = "");

}  // namespace hr::core
