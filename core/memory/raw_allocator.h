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
};

// Alignment of every segment; matches what cudaMalloc guarantees and what AVX-512 loads like.
constexpr std::size_t kSegmentAlignment = 256;

std::unique_ptr<RawAllocator> make_host_allocator();
// A CPU "device" with a fixed capacity: segments beyond it fail as cudaMalloc would.
std::unique_ptr<RawAllocator> make_capped_host_allocator(std::size_t capacity);
// Hands out fake, never-dereferenced addresses; `capacity` 0 means unlimited.
std::unique_ptr<RawAllocator> make_meta_allocator(std::size_t capacity);
// cudaMalloc/cudaFree on one device; throws "[cuda] no CUDA back-end" in builds without CUDA.
std::unique_ptr<RawAllocator> make_cuda_allocator(int device_index);

}  // namespace hr::core
