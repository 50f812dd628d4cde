// Tensor: shared storage from a device's caching allocator plus a strided view (dtype, shape, strides, offset).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/memory/caching_allocator.h"

namespace hr::core {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(2, 3)"
int64_t shape_numel(const Shape& s);

// Bytes owned by one allocation. Frees itself through its allocator (or its release hook for
// external memory such as an mmap'd checkpoint).
class Storage {
 public:
  Storage(std::shared_ptr<CachingAllocator> allocator, std::size_t bytes, Device device);
  Storage(void* external, std::size_t bytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  std::size_t nbytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  std::shared_ptr<CachingAllocator> allocator_;
  CachingAllocator::Block* block_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  std::function<void()> release_;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised; tagged with the current MemoryScope.
  static Tensor empty(const Shape& shape, DType dtype, Device device);
  static Tensor zeros(const Shape& shape, DType dtype, Device device);
  static Tensor full(const Shape& shape, float value, DType dtype, Device device);
  // Copies host floats (converted to dtype) onto a device that runs CPU kernels, or allocates only on meta.
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape, DType dtype, Device device);
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype, Device device);
  // Wraps memory owned elsewhere (no allocator accounting); `release` runs when the last view dies.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device, std::function<void()> release);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return std::size_t(numel()) * dtype_size(dtype_); }
  std::size_t element_size() const { return dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool same_storage(const Tensor& o) const { return storage_ == o.storage_; }

  void* data_ptr() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }

  // Views (no copy).
  Tensor view(const Shape& shape) const;     // requires contiguous; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view when contiguous, otherwise a contiguous copy first
  Tensor transpose(int a, int b) const;
  Tensor slice(int dim, int64_t start, int64_t end) const;
  Tensor select(int dim, int64_t index) const;  // drops `dim`
  // A broadcast view: dims of size 1 (or new leading dims) repeat with stride 0. Read-only use.
  Tensor expand(const Shape& shape) const;

  Tensor contiguous() const;  // this, if already contiguous
  Tensor clone() const;
  Tensor to(Device device) const;  // copy across devices (host <-> cpu <-> meta; cuda in the CUDA build)
  Tensor to(DType dtype) const;    // cast (see ops/cast.h)

  // Host reads for tests and logging. On meta they return zeros.
  std::vector<float> to_floats() const;
  std::vector<int64_t> to_ints() const;
  float item() const;

  std::string describe() const;  // "bf16(2, 3) on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::F32;
  Shape shape_, strides_;
  int64_t offset_ = 0;  // in elements
};

Shape contiguous_strides(const Shape& shape);

}  // namespace hr::core
