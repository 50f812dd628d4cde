// Raw allocators: where the caching allocator gets whole segments from (host heap, capped host, meta, cudaMalloc).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace hr::core {

class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  // Returns nullptr when the device is out of memory; never throws for that reason.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  // 0 means "no set capacity" (the host heap).
  virtual std::size_t capacity() const = 0;
  // Bytes this raw allocator has handed out and not taken back.
  virtual std::size_t used() const = 0;
  virtual std::string name() const = 0;
  // False for the meta device, whose addresses are never dereferenced.
  virtual bool real() const { return true; }

  // Virtual memory, for expandable segments: an address range reserved with nothing behind it, and pages of
  // `page_size()` bytes mapped and unmapped inside it. page_size() 0: not supported. map() returns false when
  // the device has no room (capacity or the driver says so); used() counts mapped bytes.
  virtual std::size_t page_size() const { return 0; }
  virtual void* reserve(std::size_t bytes);
  virtual void release(void* base, std::size_t bytes);
  virtual bool map(void* at, std::size_t bytes);
  virtual void unmap(void* at, std::size_t bytes);
  // The size of the address range an expandable segment reserves: the capacity, else what the device has.
  virtual std::size_t reservable() const { return capacity(); }
};

// The page of expandable segments: CUDA's mapping granularity, and a huge page on the host.
constexpr std::size_t kPageSize = std::size_t(2) << 20;

// Alignment of every segment; matches what cudaMalloc guarantees and what AVX-512 loads like.
constexpr std::size_t kSegmentAlignment = 256;

std::unique_ptr<RawAllocator> make_host_allocator();
// A CPU "device" with a fixed capacity: segments beyond it fail as cudaMalloc would.
std::unique_ptr<RawAllocator> make_capped_host_allocator(std::size_t capacity);
// Page-locked host memory (cudaHostAlloc, with `gpu_index` current, so that no other GPU gets a context from the
// thread that allocates) for the host device beside a GPU: transfers from it run asynchronously and at full bus
// speed. A segment the driver will not pin is ordinary heap memory. Throws "[cuda] no CUDA back-end" in builds
// without CUDA.
std::unique_ptr<RawAllocator> make_pinned_host_allocator(int gpu_index);
// Hands out fake, never-dereferenced addresses; `capacity` 0 means unlimited.
std::unique_ptr<RawAllocator> make_meta_allocator(std::size_t capacity);
// cudaMalloc/cudaFree on one device; throws "[cuda] no CUDA back-end" in builds without CUDA. `capacity` > 0 caps
// it there (device.memory_limit): a smaller card on a larger one.
std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index, std::size_t capacity = 0);

}  // namespace hr::core
