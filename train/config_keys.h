// The run configuration's key schema (config_keys.cpp), shared with the loader (config.cpp): each key's path, its
// default as YAML text and the setter that checks and stores a value.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <vector>

#include "train/config.h"

namespace hr::train::key_schema {

using Setter = std::function<void(RunConfig&, const YAML::Node&, const std::string& key)>;

struct Key {
  const char* path;
  const char* fallback;  // default as YAML text
  Setter set;
};

// Throws naming the key, its value and what it should be.
[[noreturn]] void bad_value(const std::string& key, const YAML::Node& n, const std::string& want);

template <typename T>
T get(const YAML::Node& n, const std::string& key, const char* want) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    bad_value(key, n, want);
  }
}

// The setter of a checkpoint policy for the vision tower's and/or the LLM's groups.
Setter checkpointing(bool vision, bool llm);
// memory.offload_activations (vision and llm), .vision or .llm: none | cpu | auto.
Setter activation_offload(bool vision, bool llm);
// Every key, section by section.
const std::vector<Key>& schema();
// The key at `path`, or null.
const Key* find_key(const std::string& path);
// Every valid path (with memory.gradient_checkpointing, which also takes one value for both groups).
std::vector<std::string> all_paths();

}  // namespace hr::train::key_schema
