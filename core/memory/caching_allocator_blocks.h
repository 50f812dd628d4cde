// The private parts of CachingAllocator shared by its files (caching_allocator.cpp: pools, best fit, split and
// merge, expandable segments, stats; caching_allocator_arena.cpp: the planned allocator's stretches): a block,
// a pool and an expandable segment.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/memory/caching_allocator.h"

namespace hr::core {

struct CachingAllocator::Block {
  std::size_t size = 0;       // rounded block size
  std::size_t requested = 0;  // caller's bytes while allocated
  char* ptr = nullptr;
  uint64_t segment = 0;    // which segment (in the order they were obtained)
  std::size_t offset = 0;  // offset in it
  Pool* pool = nullptr;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours within the same segment
  Block* next = nullptr;
  Category category = Category::Activations;
  const std::string* owner = nullptr;
  bool arena = false;     // planned: in the arena (pool is null)
  std::size_t index = 0;  // planned: its place among the stretch's requests (pool is null)
  bool is_split() const { return prev || next; }
};

// Free blocks by (size, address).
struct BlockLess {
  bool operator()(const CachingAllocator::Block* a, const CachingAllocator::Block* b) const;
};

struct CachingAllocator::Pool {
  bool is_small;
  std::set<Block*, BlockLess> free_blocks;  // ordered by (size, address): lower_bound is best fit
};

struct CachingAllocator::Expandable {
  char* base = nullptr;
  std::size_t size = 0;         // the reserved range
  std::vector<uint8_t> mapped;  // per page
  uint64_t id = 0;              // its segment number
  std::size_t missing(std::size_t offset, std::size_t bytes) const {
    std::size_t n = 0;
    for (std::size_t p = offset / kPageSize; p <= (offset + bytes - 1) / kPageSize; ++p) n += !mapped[p];
    return n;
  }
};

}  // namespace hr::core
