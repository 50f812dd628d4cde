// Host, capped-host and meta raw allocators.
#include "core/memory/raw_allocator.h"

#include <atomic>
#include <cstdlib>

#include "core/check.h"

namespace hr::core {

namespace {

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

class HostAllocator : public RawAllocator {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(kSegmentAlignment, align_up(bytes, kSegmentAlignment));
    if (p) used_ += bytes;
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    std::free(ptr);
    used_ -= bytes;
  }
  std::size_t capacity() const override { return 0; }
  std::size_t used() const override { return used_; }
  std::string name() const override { return "host"; }

 private:
  std::atomic<std::size_t> used_{0};
};

class CappedHostAllocator : public HostAllocator {
 public:
  explicit CappedHostAllocator(std::size_t capacity) : capacity_(capacity) {}
  void* allocate(std::size_t bytes) override {
    if (used() + bytes > capacity_) return nullptr;
    return HostAllocator::allocate(bytes);
  }
  std::size_t capacity() const override { return capacity_; }
  std::string name() const override { return str("capped host (", format_bytes(double(capacity_)), ")"); }

 private:
  std::size_t capacity_;
};

class MetaAllocator : public RawAllocator {
 public:
  explicit MetaAllocator(std::size_t capacity) : capacity_(capacity) {}
  void* allocate(std::size_t bytes) override {
    if (capacity_ && used_ + bytes > capacity_) return nullptr;
    used_ += bytes;
    std::uintptr_t addr = next_;
    next_ += align_up(bytes, kSegmentAlignment);
    return reinterpret_cast<void*>(addr);
  }
  void deallocate(void*, std::size_t bytes) override { used_ -= bytes; }
  std::size_t capacity() const override { return capacity_; }
  std::size_t used() const override { return used_; }
  std::string name() const override { return "meta"; }

 private:
  std::size_t capacity_;
  std::size_t used_ = 0;
  std::uintptr_t next_ = std::uintptr_t(1) << 40;  // far from any real heap address
};

}  // namespace

std::unique_ptr<RawAllocator> make_host_allocator() { return std::make_unique<HostAllocator>(); }
std::unique_ptr<RawAllocator> make_capped_host_allocator(std::size_t capacity) {
  return std::make_unique<CappedHostAllocator>(capacity);
}
std::unique_ptr<RawAllocator> make_meta_allocator(std::size_t capacity) {
  return std::make_unique<MetaAllocator>(capacity);
}

}  // namespace hr::core
