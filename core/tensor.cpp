// Tensor views, storage lifetime and host read-back.
#include "core/tensor.h"

#include <cstring>

#include "core/memory/device_memory.h"
#include "core/ops/copy.h"

namespace hr::core {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Storage::Storage(std::shared_ptr<CachingAllocator> allocator, std::size_t bytes, Device device)
    : allocator_(std::move(allocator)), bytes_(bytes), device_(device) {
  block_ = allocator_->allocate(bytes);
  ptr_ = CachingAllocator::data(block_);
}

Storage::Storage(void* external, std::size_t bytes, Device device, std::function<void()> release)
    : ptr_(external), bytes_(bytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (block_) allocator_->free(block_);
  if (release_) release_();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) HR_CHECK(d >= 0, "[tensor] negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ =
      std::make_shared<Storage>(allocator_for(device), std::size_t(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.f, dtype, device);
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  fill_(t, value);
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device, std::function<void()> release) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ =
      std::make_shared<Storage>(data, std::size_t(shape_numel(shape)) * dtype_size(dtype), device, std::move(release));
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, DType dtype, Device device) {
  HR_CHECK(int64_t(values.size()) == shape_numel(shape), "[tensor] ", values.size(), " values for shape ",
           shape_str(shape));
  Tensor src = wrap(const_cast<float*>(values.data()), shape, DType::F32, Device::host(), nullptr);  // read only
  Tensor t = empty(shape, dtype, device);
  copy_(t, src);
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype, Device device) {
  HR_CHECK(int64_t(values.size()) == shape_numel(shape), "[tensor] ", values.size(), " values for shape ",
           shape_str(shape));
  Tensor src = wrap(const_cast<int64_t*>(values.data()), shape, DType::I64, Device::host(), nullptr);  // read only
  Tensor t = empty(shape, dtype, device);
  copy_(t, src);
  return t;
}

int64_t Tensor::size(int d) const {
  int nd = dim();
  if (d < 0) d += nd;
  HR_CHECK(d >= 0 && d < nd, "[tensor] dimension ", d, " out of range for ", describe());
  return shape_[d];
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  HR_ASSERT(storage_, "data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  HR_CHECK(is_contiguous(), "[view] tensor ", describe(), " is not contiguous; use reshape()");
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < int(s.size()); ++i) {
    if (s[i] == -1) {
      HR_CHECK(infer < 0, "[view] more than one -1 in ", shape_str(shape));
      infer = i;
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    HR_CHECK(known > 0 && numel() % known == 0, "[view] cannot view ", describe(), " as ", shape_str(shape));
    s[infer] = numel() / known;
  }
  HR_CHECK(shape_numel(s) == numel(), "[view] cannot view ", describe(), " as ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::transpose(int a, int b) const {
  int nd = dim();
  if (a < 0) a += nd;
  if (b < 0) b += nd;
  HR_CHECK(a >= 0 && a < nd && b >= 0 && b < nd, "[transpose] dims ", a, ", ", b, " out of range for ", describe());
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  int nd = dim();
  if (d < 0) d += nd;
  HR_CHECK(d >= 0 && d < nd, "[slice] dim ", d, " out of range for ", describe());
  HR_CHECK(0 <= start && start <= end && end <= shape_[d], "[slice] range [", start, ", ", end,
           ") out of bounds for dim ", d, " of ", describe());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  int nd = dim();
  if (d < 0) d += nd;
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::expand(const Shape& shape) const {
  HR_CHECK(int(shape.size()) >= dim(), "[expand] cannot expand ", describe(), " to fewer dims ", shape_str(shape));
  Tensor t = *this;
  const int lead = int(shape.size()) - dim();
  t.shape_ = shape;
  t.strides_.assign(shape.size(), 0);
  for (int i = 0; i < dim(); ++i) {
    HR_CHECK(shape_[i] == shape[lead + i] || shape_[i] == 1, "[expand] cannot expand ", describe(), " to ",
             shape_str(shape));
    t.strides_[lead + i] = shape_[i] == 1 ? 0 : strides_[i];
  }
  return t;
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  copy_(t, *this);
  return t;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor t = empty(shape_, dtype_, d);
  copy_(t, *this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype_) return *this;
  Tensor t = empty(shape_, dt, device());
  copy_(t, *this);
  return t;
}

std::vector<float> Tensor::to_floats() const {
  std::vector<float> out(std::size_t(numel()), 0.f);
  if (device().type == DeviceType::Meta || out.empty()) return out;
  Tensor dst = wrap(out.data(), shape_, DType::F32, Device::host(), nullptr);
  copy_(dst, *this);
  return out;
}

std::vector<int64_t> Tensor::to_ints() const {
  std::vector<int64_t> out(std::size_t(numel()), 0);
  if (device().type == DeviceType::Meta || out.empty()) return out;
  Tensor dst = wrap(out.data(), shape_, DType::I64, Device::host(), nullptr);
  copy_(dst, *this);
  return out;
}

float Tensor::item() const {
  HR_CHECK(numel() == 1, "[item] tensor ", describe(), " has ", numel(), " elements, not 1");
  return to_floats()[0];
}

std::string Tensor::describe() const {
  if (!storage_) return "undefined tensor";
  return str(dtype_name(dtype_), shape_str(shape_), " on ", device().name());
}

}  // namespace hr::core
