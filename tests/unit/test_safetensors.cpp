// safetensors: round trips (all dtypes, strided and device tensors), sharded checkpoints, and strict
// rejection of corrupt files with errors that name the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/io/safetensors.h"

using namespace hr;
using namespace hr::core;

namespace {

std::string tmp(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "hr_safetensors_test";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// Writes a raw file: 8-byte header length, header text, `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RoundTripKeepsNamesShapesDtypesAndValues) {
  Tensor a = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3}, DType::F32, Device::cpu());
  Tensor b = Tensor::from_floats({1.5f, -2.25f}, {2}, DType::BF16, Device::cpu());
  Tensor c = Tensor::from_ints({7, -8, 9}, {3}, DType::I64, Device::cpu());
  Tensor t = a.transpose(0, 1);  // strided: written contiguously
  const std::string path = tmp("round.safetensors");
  save_safetensors(path, {{"a", a}, {"b", b}, {"c", c}, {"t", t}}, {{"note", "x"}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "c", "t"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");
  EXPECT_EQ(f.dtype("b"), DType::BF16);
  EXPECT_EQ(f.get("a").to_floats(), a.to_floats());
  EXPECT_EQ(f.get("b").to_floats(), (std::vector<float>{1.5f, -2.25f}));
  EXPECT_EQ(f.get("c").to_ints(), (std::vector<int64_t>{7, -8, 9}));
  EXPECT_EQ(f.shape("t"), (Shape{3, 2}));
  EXPECT_EQ(f.get("t").to_floats(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST(Safetensors, ShardedCheckpointWithIndex) {
  const std::string dir = tmp("sharded");
  std::filesystem::remove_all(dir);
  NamedTensors ts;
  for (int i = 0; i < 5; ++i)
    ts.emplace_back("w" + std::to_string(i), Tensor::full({256}, float(i), DType::F32, Device::cpu()));
  save_sharded(dir, ts, 2048);  // two 1 KiB tensors per shard
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00003-of-00003.safetensors"));
  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.names().size(), 5u);
  EXPECT_EQ(ck.get("w4").to_floats()[17], 4.f);
}

TEST(Safetensors, RejectsCorruptFilesByName) {
  const std::string p = tmp("bad.safetensors");
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, int b, int e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  // Truncated data: the tensor needs 16 bytes, the file has 8.
  write_raw(p, "{" + entry("w", "F32", "[4]", 0, 16) + "}", 8);
  EXPECT_NE(error_of(p).find("tensor 'w' bytes [0, 16) lie outside the 8-byte data section"), std::string::npos)
      << error_of(p);
  // Size disagrees with shape and dtype.
  write_raw(p, "{" + entry("w", "F32", "[3]", 0, 16) + "}", 16);
  EXPECT_NE(error_of(p).find("tensor 'w' has 16 bytes but shape (3,) of f32 needs 12"), std::string::npos)
      << error_of(p);
  // Overlap.
  write_raw(p, "{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12);
  EXPECT_NE(error_of(p).find("overlaps"), std::string::npos) << error_of(p);
  // Gap and trailing bytes.
  write_raw(p, "{" + entry("a", "F32", "[1]", 4, 8) + "}", 8);
  EXPECT_NE(error_of(p).find("gap of 4 bytes before tensor 'a'"), std::string::npos) << error_of(p);
  write_raw(p, "{" + entry("a", "F32", "[1]", 0, 4) + "}", 8);
  EXPECT_NE(error_of(p).find("4 trailing bytes"), std::string::npos) << error_of(p);
  // Unknown dtype, negative dim, broken JSON, header longer than the file.
  write_raw(p, "{" + entry("x", "F64", "[1]", 0, 8) + "}", 8);
  EXPECT_NE(error_of(p).find("tensor 'x' has unsupported dtype \"F64\""), std::string::npos) << error_of(p);
  write_raw(p, "{" + entry("x", "F32", "[-1]", 0, 4) + "}", 4);
  EXPECT_NE(error_of(p).find("negative"), std::string::npos) << error_of(p);
  write_raw(p, "{\"x\":", 0);
  EXPECT_NE(error_of(p).find("not valid JSON"), std::string::npos) << error_of(p);
  {
    std::ofstream out(p, std::ios::binary);
    uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(error_of(p).find("runs past the end"), std::string::npos) << error_of(p);
  EXPECT_NE(error_of(p).find(p), std::string::npos) << "the error names the file";
}

TEST(Safetensors, ByteCountsThatOverflowAreRejectedBeforeAnyAllocation) {
  const std::string p = tmp("overflow.safetensors");
  // 2^31 x 2^31 f32 elements are 2^64 bytes: a wrapping count would make it 0 and match data_offsets [0, 0].
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of(p).find("tensor 'w' shape [2147483648,2147483648] of f32 overflows a 64-bit byte count"),
            std::string::npos)
      << error_of(p);
  // A dimension above INT64_MAX, and a zero dim beside dims whose product overflows (strides would).
  write_raw(p, R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of(p).find("tensor 'w' shape [18446744073709551615] overflows"), std::string::npos) << error_of(p);
  write_raw(p, R"({"w":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of(p).find("tensor 'w' shape [0,4294967296,4294967296] overflows"), std::string::npos) << error_of(p);
  // A header length near 2^64 must not wrap the "fits in the file" check.
  {
    std::ofstream out(p, std::ios::binary);
    uint64_t n = ~uint64_t(0) - 3;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(error_of(p).find("exceeds the 100 MiB limit"), std::string::npos) << error_of(p);
  // The in-memory entry point applies the same checks and names what it was given.
  std::string bytes(8, '\0');
  const std::string header = R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})";
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  std::string got;
  try {
    SafetensorsFile::from_bytes("mem.safetensors", bytes + header);
  } catch (const Error& e) {
    got = e.what();
  }
  EXPECT_NE(got.find("[safetensors] mem.safetensors: tensor 'w'"), std::string::npos) << got;
}

TEST(Safetensors, MisalignedTensorsAreReadThroughAnAlignedCopy) {
  // One U8 byte puts the F32 tensor after it at an odd address; kernels read it through a float pointer.
  std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const float values[2] = {1.25f, -3.5f};
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header + std::string(1, '\x07') + std::string(reinterpret_cast<const char*>(values), 8);
  const std::string p = tmp("misaligned.safetensors");
  std::ofstream(p, std::ios::binary) << bytes;
  for (const SafetensorsFile& f : {SafetensorsFile::open(p), SafetensorsFile::from_bytes("mem", bytes)}) {
    Tensor b = f.get("b");
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data_ptr()) % alignof(float), 0u);
    EXPECT_EQ(b.to_floats(), (std::vector<float>{1.25f, -3.5f}));
    EXPECT_EQ(f.get("a").to_ints(), (std::vector<int64_t>{7}));
  }
}

TEST(Safetensors, IndexMustMapTensorsToFileNamesBesideIt) {
  const std::string idx = "ck/model.safetensors.index.json";
  auto error = [&](const std::string& text) {
    try {
      parse_safetensors_index(text, idx);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(parse_safetensors_index(R"({"weight_map":{"a":"model-1.safetensors"}})", idx).at("a"),
            "model-1.safetensors");
  EXPECT_NE(error(R"({"weight_map":{"a":7}})").find(idx + ": weight_map maps 'a' to 7, not a file name"),
            std::string::npos)
      << error(R"({"weight_map":{"a":7}})");
  EXPECT_NE(
      error(R"({"weight_map":{"a":"../../secret"}})").find("maps 'a' to '../../secret', which is not a file name"),
      std::string::npos);
  EXPECT_NE(error("[1, 2]").find(idx + ": no weight_map object"), std::string::npos);
  EXPECT_NE(error("{\"weight_map\":").find(idx + ": not valid JSON"), std::string::npos);
}

TEST(Safetensors, AtomicWriteLeavesNoPartialFile) {
  const std::string path = tmp("atomic.safetensors");
  save_safetensors(path, {{"a", Tensor::full({4}, 1.f, DType::F32, Device::cpu())}});
  // A failing write (duplicate names) must leave the previous file intact and no temporary behind.
  EXPECT_THROW(save_safetensors(path, {{"a", Tensor::full({4}, 2.f, DType::F32, Device::cpu())},
                                       {"a", Tensor::full({4}, 3.f, DType::F32, Device::cpu())}}),
               Error);
  EXPECT_EQ(SafetensorsFile::open(path).get("a").to_floats()[0], 1.f);
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}
