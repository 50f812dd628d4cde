// Batch files: a micro-batch in one safetensors file.
#include "data/batch.h"

#include "core/check.h"
#include "core/io/safetensors.h"

namespace hr::data {

using namespace hr::core;

Batch read_batch_file(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  for (const char* need : {"input_ids", "labels"})
    HR_CHECK(f.contains(need), "[batch] ", path, " has no '", need,
             "' tensor (needs input_ids and labels, and optionally pixel_values and image_sizes)");
  const Tensor ids = f.get("input_ids"), labels = f.get("labels");
  HR_CHECK(ids.dim() == 2 && labels.shape() == ids.shape(), "[batch] ", path, ": input_ids ", shape_str(ids.shape()),
           " and labels ", shape_str(labels.shape()), " must both be (batch, seq)");
  Batch b;
  b.batch = ids.size(0);
  b.seq = ids.size(1);
  b.input_ids = ids.to_ints();
  b.labels = labels.to_ints();
  if (f.contains("pixel_values")) b.pixel_values = f.get("pixel_values").clone();
  if (f.contains("image_sizes")) {
    const Tensor sizes = f.get("image_sizes");
    HR_CHECK(sizes.dim() == 2 && sizes.size(1) == 2, "[batch] ", path, ": image_sizes ", shape_str(sizes.shape()),
             " must be (images, 2): each image's height and width");
    const std::vector<int64_t> v = sizes.to_ints();
    for (std::size_t i = 0; i < v.size(); i += 2) b.image_sizes.push_back({v[i], v[i + 1]});
  }
  return b;
}

void write_batch_file(const std::string& path, const Batch& b) {
  NamedTensors out = {{"input_ids", Tensor::from_ints(b.input_ids, {b.batch, b.seq}, DType::I64, Device::cpu())},
                      {"labels", Tensor::from_ints(b.labels, {b.batch, b.seq}, DType::I64, Device::cpu())}};
  if (b.pixel_values.defined()) out.emplace_back("pixel_values", b.pixel_values);
  if (!b.image_sizes.empty()) {
    std::vector<int64_t> v;
    for (const Resolution& r : b.image_sizes) v.push_back(r.height), v.push_back(r.width);
    out.emplace_back("image_sizes",
                     Tensor::from_ints(v, {int64_t(b.image_sizes.size()), 2}, DType::I64, Device::cpu()));
  }
  save_safetensors(path, out);
}

}  // namespace hr::data
