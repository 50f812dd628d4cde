// safetensors read (memory-mapped, header validated strictly) and write (atomic), single files and
// sharded checkpoints with a model.safetensors.index.json.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace hr::core {

// One tensor of a safetensors header, as validated: its dtype, shape and bytes within the data section.
struct SafetensorsEntry {
  DType dtype;
  Shape shape;
  std::size_t begin, end;
};

// A read-only view of one safetensors file. Tensors returned by get() live on Device::host and point
// into the mapping, which stays alive while any of them does.
class SafetensorsFile {
 public:
  // Throws hr::Error naming the file and what is wrong (size, offsets, dtype, overlap, truncation).
  static SafetensorsFile open(const std::string& path);
  // The same checks on a file's bytes held in memory; `name` stands for the path in errors.
  static SafetensorsFile from_bytes(const std::string& name, std::string bytes);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in file order of their data
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  const Shape& shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  using Entry = SafetensorsEntry;
  const Entry& entry(const std::string& name) const;
  // Validates the header of the `size` bytes at `base`, which `keep` keeps alive.
  static SafetensorsFile parse(const std::string& path, std::shared_ptr<void> keep, const char* base, std::size_t size);

  std::string path_;
  std::shared_ptr<void> mapping_;  // munmap on release
  const char* data_ = nullptr;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes atomically (temporary file, fsync, rename). Tensors may live on any device and be strided.
// `metadata` goes to __metadata__; "format": "pt" is added unless given.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      std::map<std::string, std::string> metadata = {});

// Writes model-0000i-of-0000n.safetensors shards of at most `max_shard_bytes` each (a tensor larger
// than that gets its own shard) and model.safetensors.index.json into `dir`.
void save_sharded(const std::string& dir, const NamedTensors& tensors, std::size_t max_shard_bytes);

// The weight_map of a model.safetensors.index.json (tensor name -> shard file name in the index's folder),
// validated: an object of strings, each a plain file name. `index_path` names the file in errors.
std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& index_path);

// All tensors of a checkpoint: a .safetensors file, or a directory holding model.safetensors or a
// model.safetensors.index.json with its shards.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  const SafetensorsFile& file_of(const std::string& name) const;
  Tensor get(const std::string& name) const { return file_of(name).get(name); }

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t> where_;
};

}  // namespace hr::core
