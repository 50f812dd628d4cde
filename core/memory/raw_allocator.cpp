// Host, capped-host and meta raw allocators.
#include "core/memory/raw_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

#include "core/check.h"

namespace hr::core {

void* RawAllocator::reserve(std::size_t) {
  return nullptr;
}
void RawAllocator::release(void*, std::size_t) {}
bool RawAllocator::map(void*, std::size_t) {
  return false;
}
void RawAllocator::unmap(void*, std::size_t) {}

namespace {

std::size_t align_up(std::size_t n, std::size_t a) {
  return (n + a - 1) / a * a;
}

// The OS's page size: a segment's mapping is a whole number of pages.
std::size_t os_page() {
  static const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
  return page;
}

class HostAllocator : public RawAllocator {
 public:
  // Each segment is a mapping of its own, and freeing it unmaps it: its pages go back to the OS at once. Through
  // malloc they did not: glibc raises its mmap threshold to the size of each mapped block it frees (up to 32 MiB),
  // so after the caching allocator first released a segment (an evaluation, empty_cache) later segments came from
  // the heap, and once released stayed in the process (the quickstart's resident set grew by 101 MiB at its first
  // evaluation, with the allocators' reserved bytes unchanged, and the leak watch said so).
  void* allocate(std::size_t bytes) override {
    void* p = mmap(nullptr, align_up(bytes, os_page()), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    used_ += bytes;
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    munmap(ptr, align_up(bytes, os_page()));
    used_ -= bytes;
  }
  std::size_t capacity() const override { return 0; }
  std::size_t used() const override { return used_; }
  std::string name() const override { return "host"; }

  // Expandable segments on the host: addresses reserved with PROT_NONE (no memory behind them), pages made
  // readable and writable to map them, and given back with MADV_DONTNEED (the kernel drops them at once).
  std::size_t page_size() const override { return kPageSize; }
  void* reserve(std::size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void release(void* base, std::size_t bytes) override { munmap(base, bytes); }
  bool map(void* at, std::size_t bytes) override {
    if (mprotect(at, bytes, PROT_READ | PROT_WRITE) != 0) return false;
    used_ += bytes;
    return true;
  }
  void unmap(void* at, std::size_t bytes) override {
    madvise(at, bytes, MADV_DONTNEED);
    mprotect(at, bytes, PROT_NONE);
    used_ -= bytes;
  }
  std::size_t reservable() const override {
    return std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(sysconf(_SC_PAGESIZE));
  }

 protected:
  std::atomic<std::size_t> used_{0};
};

class CappedHostAllocator : public HostAllocator {
 public:
  explicit CappedHostAllocator(std::size_t capacity) : capacity_(capacity) {}
  void* allocate(std::size_t bytes) override {
    if (used() + bytes > capacity_) return nullptr;
    return HostAllocator::allocate(bytes);
  }
  bool map(void* at, std::size_t bytes) override {
    if (used() + bytes > capacity_) return false;
    return HostAllocator::map(at, bytes);
  }
  std::size_t capacity() const override { return capacity_; }
  std::size_t reservable() const override { return capacity_; }
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
  bool real() const override { return false; }

  std::size_t page_size() const override { return kPageSize; }
  void* reserve(std::size_t bytes) override {
    std::uintptr_t addr = next_;
    next_ += align_up(bytes, kPageSize);
    return reinterpret_cast<void*>(addr);
  }
  bool map(void*, std::size_t bytes) override {
    if (capacity_ && used_ + bytes > capacity_) return false;
    used_ += bytes;
    return true;
  }
  void unmap(void*, std::size_t bytes) override { used_ -= bytes; }
  std::size_t reservable() const override { return capacity_ ? capacity_ : std::size_t(1) << 40; }

 private:
  std::size_t capacity_;
  std::size_t used_ = 0;
  std::uintptr_t next_ = std::uintptr_t(1) << 40;  // far from any real heap address
};

}  // namespace

std::unique_ptr<RawAllocator> make_host_allocator() {
  return std::make_unique<HostAllocator>();
}
std::unique_ptr<RawAllocator> make_capped_host_allocator(std::size_t capacity) {
  return std::make_unique<CappedHostAllocator>(capacity);
}
std::unique_ptr<RawAllocator> make_meta_allocator(std::size_t capacity) {
  return std::make_unique<MetaAllocator>(capacity);
}

}  // namespace hr::core
