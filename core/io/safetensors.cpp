// safetensors: strict header validation on read, atomic write, sharded checkpoints.
#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/atomic_file.h"
#include "core/ops/copy.h"

namespace hr::core {

namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxHeaderBytes = std::size_t(100) << 20;  // the reference implementation's limit

const char* st_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8})
    if (s == st_dtype(t)) {
      *out = t;
      return true;
    }
  return false;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const std::string where = "[safetensors] " + path + ": ";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HR_CHECK(fd >= 0, where, "cannot open: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(where + "cannot stat");
  }
  const std::size_t size = std::size_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw Error(str(where, "file is ", size, " bytes; a safetensors file starts with an 8-byte header length"));
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  HR_CHECK(m != MAP_FAILED, where, "mmap failed: ", std::strerror(errno));
  std::shared_ptr<void> mapping(m, [size](void* p) { munmap(p, size); });
  return parse(path, std::move(mapping), static_cast<const char*>(m), size);
}

SafetensorsFile SafetensorsFile::from_bytes(const std::string& name, std::string bytes) {
  auto owned = std::make_shared<std::string>(std::move(bytes));
  const char* base = owned->data();
  const std::size_t size = owned->size();
  return parse(name, std::move(owned), base, size);
}

namespace {

// The JSON header of the `size` bytes at `base` and its length, or a named error: both length checks come before
// anything is allocated for it.
json read_header(const std::string& where, const char* base, std::size_t size, uint64_t* length) {
  HR_CHECK(size >= 8, where, "file is ", size, " bytes; a safetensors file starts with an 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, base, 8);  // little-endian on every platform we build for
  HR_CHECK(n <= kMaxHeaderBytes, where, "header length ", n, " exceeds the 100 MiB limit (corrupt or not safetensors)");
  HR_CHECK(n <= size - 8, where, "header length ", n, " runs past the end of the ", size, "-byte file (truncated?)");
  HR_CHECK(n >= 2 && base[8] == '{', where, "header is not a JSON object");
  json header;
  try {
    header = json::parse(base + 8, base + 8 + n);
  } catch (const json::exception& e) {
    throw Error(where + "header is not valid JSON: " + e.what());
  }
  HR_CHECK(header.is_object(), where, "header is not a JSON object");
  *length = n;
  return header;
}

std::map<std::string, std::string> read_metadata(const std::string& where, const json& m) {
  HR_CHECK(m.is_object(), where, "__metadata__ must be an object of strings");
  std::map<std::string, std::string> out;
  for (auto it = m.begin(); it != m.end(); ++it) {
    HR_CHECK(it->is_string(), where, "__metadata__ value of '", it.key(), "' is not a string");
    out[it.key()] = it->get<std::string>();
  }
  return out;
}

// The shape, and the bytes it needs of `dtype`. Every count is checked for overflow before anything trusts it: a
// shape such as [2^31, 2^31] of f32 must not wrap to 0 bytes and pass as an empty tensor.
uint64_t read_shape(const std::string& where, const std::string& name, const json& shape, DType dtype, Shape* out) {
  HR_CHECK(shape.is_array(), where, "tensor '", name, "' shape is not an array");
  uint64_t count = 1, nonzero = 1;  // `nonzero`: the product without zero dims, which strides still multiply
  for (const json& d : shape) {
    HR_CHECK(d.is_number_unsigned(), where, "tensor '", name, "' has a negative or non-integer dimension");
    const uint64_t v = d.get<uint64_t>();
    const bool fits = v <= uint64_t(INT64_MAX) && (v == 0 || !__builtin_mul_overflow(nonzero, v, &nonzero));
    HR_CHECK(fits && nonzero <= uint64_t(INT64_MAX), where, "tensor '", name, "' shape ", shape.dump(),
             " overflows 64-bit element counts");
    count = v == 0 ? 0 : count * v;  // count <= nonzero, which did not overflow
    out->push_back(int64_t(v));
  }
  uint64_t bytes = 0;
  HR_CHECK(!__builtin_mul_overflow(count, uint64_t(dtype_size(dtype)), &bytes), where, "tensor '", name, "' shape ",
           shape.dump(), " of ", dtype_name(dtype), " overflows a 64-bit byte count");
  return bytes;
}

SafetensorsEntry read_entry(const std::string& where, const std::string& name, const json& e, std::size_t data_size) {
  HR_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), where, "tensor '",
           name, "' needs dtype, shape and data_offsets");
  SafetensorsEntry en;
  HR_CHECK(e["dtype"].is_string() && parse_st_dtype(e["dtype"].get<std::string>(), &en.dtype), where, "tensor '", name,
           "' has unsupported dtype ", e["dtype"].dump(), " (supported: F32, BF16, F16, I32, I64, U8)");
  const uint64_t bytes = read_shape(where, name, e["shape"], en.dtype, &en.shape);
  const json& off = e["data_offsets"];
  HR_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
           "tensor '", name, "' data_offsets must be [begin, end]");
  en.begin = off[0].get<std::size_t>();
  en.end = off[1].get<std::size_t>();
  HR_CHECK(en.begin <= en.end && en.end <= data_size, where, "tensor '", name, "' bytes [", en.begin, ", ", en.end,
           ") lie outside the ", data_size, "-byte data section (truncated file?)");
  HR_CHECK(en.end - en.begin == bytes, where, "tensor '", name, "' has ", en.end - en.begin, " bytes but shape ",
           shape_str(en.shape), " of ", dtype_name(en.dtype), " needs ", bytes);
  return en;
}

// Tensors must tile the data section exactly: no overlap, no gap, nothing trailing.
void check_tiling(const std::string& where, const std::map<std::string, SafetensorsEntry>& entries,
                  std::size_t data_size) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> spans;
  for (const auto& [name, en] : entries) spans.emplace_back(&name, &en);
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
  });
  std::size_t at = 0;
  for (const auto& [name, en] : spans) {
    HR_CHECK(en->begin >= at, where, "tensor '", *name, "' overlaps the tensor before it");
    HR_CHECK(en->begin == at, where, "gap of ", en->begin - at, " bytes before tensor '", *name, "'");
    at = en->end;
  }
  HR_CHECK(at == data_size, where, data_size - at, " trailing bytes after the last tensor");
}

}  // namespace

SafetensorsFile SafetensorsFile::parse(const std::string& path, std::shared_ptr<void> keep, const char* base,
                                       std::size_t size) {
  const std::string where = "[safetensors] " + path + ": ";
  uint64_t n = 0;
  const json header = read_header(where, base, size, &n);
  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = std::move(keep);
  f.data_ = base + 8 + n;
  const std::size_t data_size = size - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      f.metadata_ = read_metadata(where, *it);
    else
      f.entries_.emplace(it.key(), read_entry(where, it.key(), *it, data_size));
  }
  check_tiling(where, f.entries_, data_size);
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::pair<std::size_t, std::string>> v;
  for (const auto& [n, e] : entries_) v.emplace_back(e.begin, n);
  std::sort(v.begin(), v.end());
  std::vector<std::string> out;
  for (auto& p : v) out.push_back(p.second);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  HR_CHECK(it != entries_.end(), "[safetensors] ", path_, ": no tensor '", name, "'");
  return it->second;
}

const Shape& SafetensorsFile::shape(const std::string& name) const {
  return entry(name).shape;
}
DType SafetensorsFile::dtype(const std::string& name) const {
  return entry(name).dtype;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const Entry& e = entry(name);
  const char* at = data_ + e.begin;
  // Offsets need not be multiples of the dtype's size (a U8 tensor of odd length before an F32 one): a
  // misaligned tensor is copied, since kernels read elements through typed pointers.
  if (reinterpret_cast<std::uintptr_t>(at) % dtype_size(e.dtype) != 0) {
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::host());
    if (e.end > e.begin) std::memcpy(t.data_ptr(), at, e.end - e.begin);
    return t;
  }
  std::shared_ptr<void> keep = mapping_;
  // The mapping is read-only: writers must copy first (the returned tensor is for reading and casting).
  return Tensor::wrap(const_cast<char*>(at), e.shape, e.dtype, Device::host(), [keep] {});
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      std::map<std::string, std::string> metadata) {
  json header = json::object();
  if (!metadata.count("format")) metadata["format"] = "pt";
  header["__metadata__"] = metadata;
  std::size_t at = 0;
  for (const auto& [name, t] : tensors) {
    HR_CHECK(!header.contains(name), "[safetensors] ", path, ": duplicate tensor name '", name, "'");
    json shape = json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    const std::size_t bytes = std::size_t(t.numel()) * dtype_size(t.dtype());
    header[name] = {{"dtype", st_dtype(t.dtype())}, {"shape", shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  AtomicFile out(path);
  uint64_t n = text.size();
  out.write(&n, 8);
  out.write(text.data(), text.size());
  // One tensor at a time: memory the CPU can read is written as it is; anything else (a GPU tensor, a
  // strided view) goes through one host copy, freed before the next, so a checkpoint never stages the
  // whole model in host memory.
  for (const auto& [name, t] : tensors) {
    const DeviceType d = t.device().type;
    if ((d == DeviceType::Host || d == DeviceType::CPU) && t.is_contiguous()) {
      out.write(t.data_ptr(), t.nbytes());
      continue;
    }
    const Tensor h = t.contiguous().to(Device::host());
    out.write(h.data_ptr(), h.nbytes());
  }
  out.commit();
}

void save_sharded(const std::string& dir, const NamedTensors& tensors, std::size_t max_shard_bytes) {
  std::filesystem::create_directories(dir);
  std::vector<NamedTensors> shards(1);
  std::size_t bytes = 0, total = 0;
  for (const auto& nt : tensors) {
    if (!shards.back().empty() && bytes + nt.second.nbytes() > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(nt);
    bytes += nt.second.nbytes();
    total += nt.second.nbytes();
  }
  json map = json::object();
  char name[64];
  for (std::size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    save_safetensors(dir + "/" + name, shards[i]);
    for (const auto& nt : shards[i]) map[nt.first] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  AtomicFile out(dir + "/model.safetensors.index.json");
  std::string text = index.dump(2) + "\n";
  out.write(text.data(), text.size());
  out.commit();
}

std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& index_path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str("[checkpoint] ", index_path, ": not valid JSON: ", e.what()));
  }
  HR_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "[checkpoint] ", index_path,
           ": no weight_map object");
  std::map<std::string, std::string> wanted;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    HR_CHECK(it->is_string(), "[checkpoint] ", index_path, ": weight_map maps '", it.key(), "' to ", it->dump(),
             ", not a file name");
    const std::string& file = it->get_ref<const std::string&>();
    // Shards sit next to the index: a path that leaves the folder is refused, not followed.
    HR_CHECK(!file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos &&
                 file.find('\0') == std::string::npos,
             "[checkpoint] ", index_path, ": weight_map maps '", it.key(), "' to '", file,
             "', which is not a file name in the index's folder");
    wanted[it.key()] = file;
  }
  return wanted;
}

Checkpoint Checkpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  Checkpoint c;
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    const std::string index = path + "/model.safetensors.index.json";
    if (fs::exists(index)) {
      std::ifstream in(index, std::ios::binary);
      HR_CHECK(in, "[checkpoint] ", index, ": cannot open");
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const std::map<std::string, std::string> wanted = parse_safetensors_index(text, index);
      std::vector<std::string> unique;
      for (const auto& [n, f] : wanted)
        if (std::find(unique.begin(), unique.end(), f) == unique.end()) unique.push_back(f);
      for (const std::string& f : unique) files.push_back(path + "/" + f);
      for (const std::string& f : files) c.files_.push_back(SafetensorsFile::open(f));
      for (const auto& [n, f] : wanted) {
        std::size_t i = std::find(unique.begin(), unique.end(), f) - unique.begin();
        HR_CHECK(c.files_[i].contains(n), "[checkpoint] ", index, " maps '", n, "' to ", f, ", which does not hold it");
        c.where_[n] = i;
      }
      return c;
    }
    HR_CHECK(fs::exists(path + "/model.safetensors"), "[checkpoint] ", path,
             ": neither model.safetensors nor model.safetensors.index.json found");
    files.push_back(path + "/model.safetensors");
  } else {
    files.push_back(path);
  }
  for (const std::string& f : files) c.files_.push_back(SafetensorsFile::open(f));
  for (std::size_t i = 0; i < c.files_.size(); ++i)
    for (const std::string& n : c.files_[i].names()) c.where_[n] = i;
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> v;
  for (const auto& [n, i] : where_) v.push_back(n);
  return v;
}

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  HR_CHECK(it != where_.end(), "[checkpoint] no tensor '", name, "'");
  return files_[it->second];
}

}  // namespace hr::core
