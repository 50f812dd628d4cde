// Helpers for tests that read the PyTorch golden files in tests/golden/.
#pragma once

#include <cmath>
#include <fstream>
#include <string>

#include "core/io/safetensors.h"
#include "models/llava.h"

namespace hr::test {

inline std::string golden(const std::string& file) {
  return std::string(HR_SOURCE_DIR) + "/tests/golden/" + file;
}

// A batch from a golden *_batch.safetensors (input_ids, labels, optional pixel_values and image_sizes).
inline data::Batch load_batch(const std::string& path) {
  return data::read_batch_file(path);
}

inline std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

struct Mismatch {
  double worst = 0;  // largest |got - want| / (atol + rtol * |want|); <= 1 passes
  std::size_t at = 0;
  float got = 0, want = 0;
};

inline Mismatch compare(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol) {
  Mismatch m;
  for (std::size_t i = 0; i < want.size(); ++i) {
    double r = std::fabs(double(got[i]) - want[i]) / (atol + rtol * std::fabs(want[i]));
    if (r > m.worst || std::isnan(r)) m = {std::isnan(r) ? 1e30 : r, i, got[i], want[i]};
  }
  return m;
}

}  // namespace hr::test
