// One caching allocator over any raw allocator, with PyTorch's pools, rounding, split/merge and stats, per category.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "core/memory/category.h"
#include "core/memory/raw_allocator.h"

namespace hr::core {

constexpr std::size_t kMinBlockSize = 512;      // every request is rounded up to a multiple of this
constexpr std::size_t kSmallSize = 1_MiB;       // requests up to this come from the small pool
constexpr std::size_t kSmallBuffer = 2_MiB;     // small-pool segment size
constexpr std::size_t kLargeBuffer = 20_MiB;    // segment size for requests between 1 and 10 MiB
constexpr std::size_t kMinLargeAlloc = 10_MiB;  // at or above this a request gets its own segment
constexpr std::size_t kRoundLarge = 2_MiB;      // ... rounded up to a multiple of this

// How a device's memory is organised (memory.allocator):
// - Caching: PyTorch's caching allocator (segments of 2 MiB, 20 MiB or the request rounded to 2 MiB; best fit;
//   split and merge; blocks cached until empty_cache).
// - Expandable: PyTorch's expandable segments: one reserved address range per pool whose 2 MiB pages are mapped
//   as blocks need them and unmapped when the cache is released; blocks always split, so no large block strands
//   a remainder. Reserved = mapped.
// - Planned: a planned stretch (a training step) takes every request it frees from one arena, at offsets
//   worked out from its dry run (ArenaLayout); what it leaves allocated, and everything outside a stretch, gets
//   segments of exactly its size, and a cached block serves only a request of its size. Reserved = arena +
//   segments (after empty_cache: the arena and the live blocks exactly).
enum class AllocatorKind : uint8_t { Caching, Expandable, Planned };
const char* allocator_kind_name(AllocatorKind k);

struct ArenaLayout;  // arena_plan.h

// One counter with PyTorch's four faces: current, peak, and cumulative allocated/freed.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;
  void add(int64_t delta) {
    current += delta;
    if (delta > 0)
      allocated += delta;
    else
      freed -= delta;
    if (current > peak) peak = current;
  }
  void reset_peak() { peak = current; }
};

struct MemoryStats {
  Stat allocated_bytes;       // bytes in blocks handed out (rounded sizes)
  Stat reserved_bytes;        // bytes in segments obtained from the raw allocator
  Stat active_bytes;          // allocated blocks (no streams here, so equal to allocated)
  Stat inactive_split_bytes;  // free blocks inside segments that are split: the fragmentation that costs
  Stat requested_bytes;       // bytes callers asked for, before rounding
  Stat allocation;            // count of allocated blocks
  Stat segment;               // count of segments
  Stat inactive_split;        // count of free split blocks
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  std::array<Stat, kNumCategories> by_category;  // allocated bytes per category
  // Allocated bytes per category at the moment allocated_bytes reached its peak (the first time it did).
  std::array<int64_t, kNumCategories> at_peak{};

  const Stat& category(Category c) const { return by_category[std::size_t(c)]; }
  // 1 - allocated / reserved (0 when nothing is reserved).
  double fragmentation() const;
};

// One event in the allocation trace (for tests comparing meta and real devices, and timelines).
struct TraceEvent {
  // Retry: a request found no segment and releases the cache to try once more (its segment frees follow).
  enum class Kind : uint8_t { Alloc, Free, SegmentAlloc, SegmentFree, OOM, Retry };
  Kind kind;
  std::size_t size;       // block or segment size (rounded)
  std::size_t requested;  // caller's bytes (Alloc/Free/OOM)
  Category category;
  const std::string* owner;
  // Alloc/Free: which block (an identity while it is allocated, never data); SegmentAlloc/SegmentFree: the
  // segment's block at offset 0. Valid only during the call (position() reads where it is).
  const void* block = nullptr;
};

// An allocator's layout at one moment: every segment and its blocks, in segment order. What a replica is
// built from, so a step can be replayed from exactly the state a real allocator was in.
struct AllocatorSnapshot {
  struct Block {
    std::size_t offset = 0, size = 0, requested = 0;
    bool allocated = false;
    Category category = Category::Activations;
    std::string owner;
  };
  struct Segment {
    uint64_t id = 0;  // segments are numbered in the order they were obtained
    bool small = false;
    std::size_t size = 0;
    std::vector<Block> blocks;  // by offset, covering the segment
    bool expandable = false;    // an expandable segment: `size` is the reserved range, `mapped` what has pages
    std::vector<std::pair<std::size_t, std::size_t>> mapped;  // (offset, bytes) runs of mapped pages
  };
  AllocatorKind kind = AllocatorKind::Caching;
  std::vector<Segment> segments;
  uint64_t segments_made = 0;
  std::size_t arena = 0;       // planned: the arena's size
  std::vector<Block> stretch;  // planned, inside a stretch that records: its live requests in order
  // Equal snapshots behave alike: the same requests from either give the same blocks and the same peaks.
  bool operator==(const AllocatorSnapshot&) const;
};

class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, std::size_t requested) : Error(what), requested_(requested) {}
  std::size_t requested() const { return requested_; }

 private:
  std::size_t requested_;
};

class CachingAllocator {
 public:
  struct Block;

  CachingAllocator(std::unique_ptr<RawAllocator> raw, std::string device_name,
                   AllocatorKind kind = AllocatorKind::Caching);
  // A replica of the allocator `state` was taken from: the same segments (numbers, sizes) and blocks
  // (offsets, sizes, allocated or cached, tags) over `raw`, which must have room for them. Peaks start at
  // the current values. Its allocated blocks belong to nobody: destroying the replica releases them.
  CachingAllocator(const AllocatorSnapshot& state, std::unique_ptr<RawAllocator> raw, std::string device_name);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Tagged with the current MemoryScope. Zero bytes still returns a distinct block (of 512 B),
  // as PyTorch does. Throws OutOfMemory after releasing the cache and retrying once.
  Block* allocate(std::size_t bytes);
  void free(Block* block);
  static void* data(const Block* b);
  static std::size_t block_size(const Block* b);
  // A block's place independent of the addresses the raw allocator returned: (segment number, offset).
  // Best fit breaks ties by it, so the meta device (fake addresses) chooses the same blocks as a real one.
  static std::pair<uint64_t, std::size_t> position(const Block* b);

  AllocatorSnapshot snapshot() const;

  // Returns every whole free segment to the raw allocator (expandable: unmaps every page no block uses; planned:
  // the arena too, outside a stretch).
  void empty_cache();
  AllocatorKind kind() const { return kind_; }

  // Planned stretches (AllocatorKind::Planned only). Requests from begin to end (allocations and frees, counted
  // in order) follow `layout`: the arena grows to its size first (releasing the cache and retrying once, then
  // OutOfMemory). A request other than the layout's (a different shape, a skipped update) breaks the plan: it
  // and the rest of the stretch take segments as outside one, and stretch_broken() says so until the next begin.
  // With a null layout (meta device only) the stretch records: requests get addresses of no arena, and
  // end_stretch(layout) grows the arena to the layout worked out from them and gives what is still allocated
  // its segments, in request order, leaving the allocator as a stretch that followed `layout` would have.
  void begin_stretch(std::shared_ptr<const ArenaLayout> layout);
  void end_stretch(std::shared_ptr<const ArenaLayout> layout = nullptr);
  // Counts `requests` requests as made (replay skips repetitions that would change nothing).
  void skip_requests(std::size_t requests);
  bool stretch_broken() const;
  bool stretch_open() const;
  std::size_t arena_size() const;
  void reset_peak_stats();
  MemoryStats stats() const;
  // Current and peak allocated bytes per owner name.
  std::unordered_map<std::string, Stat> owner_stats() const;
  std::size_t capacity() const { return raw_->capacity(); }
  // The planned arena's bytes held now (0: none).
  std::size_t arena_bytes() const;
  const std::string& device_name() const { return device_name_; }
  RawAllocator& raw() { return *raw_; }

  // A readable table: totals, per category, largest owners, fragmentation.
  std::string memory_summary() const;

  // Called for every event while set; pass {} to stop. Runs under the allocator's lock.
  void set_trace(std::function<void(const TraceEvent&)> trace);
  // Called, under the allocator's lock, with its layout and the request's bytes when a request fails after
  // the cache was released: the moment an out-of-memory snapshot shows (PyTorch's out-of-memory observer).
  void set_oom_observer(std::function<void(const AllocatorSnapshot&, std::size_t)> observer);

 private:
  struct Pool;
  struct Expandable;
  Block* malloc_locked(std::size_t bytes);
  Block* malloc_segments_locked(std::size_t bytes, std::size_t size, const MemoryTag& tag);
  Block* malloc_expandable(Pool& pool, std::size_t size, const MemoryTag& tag, std::size_t bytes);
  bool map_range(Expandable& e, std::size_t offset, std::size_t bytes);
  void unmap_unused(Expandable& e);
  void split_block(Pool& pool, Block* block, std::size_t size);
  [[noreturn]] void out_of_memory(std::size_t bytes, std::size_t size, std::size_t seg, const MemoryTag& tag);
  Block* stretch_alloc(std::size_t bytes, std::size_t size, const MemoryTag& tag);
  bool stretch_free(Block* block);
  bool grow_arena(std::size_t bytes);
  void release_arena();
  void retire_arena(std::vector<Block*> live);
  void adopt(Block* b);
  void sync_expandable_stats();
  Block* find_free_block(Pool& pool, std::size_t size);
  Block* alloc_segment(Pool& pool, std::size_t segment_size);
  void release_cached_blocks_locked();
  AllocatorSnapshot snapshot_locked() const;
  AllocatorSnapshot::Segment snapshot_segment(uint64_t id, const Block* head) const;
  void destroy_replica_locked();
  void release_unused_expandable_locked();
  void release_pool(Pool& pool);
  void free_locked(Block* block);
  void account(Block* b, int sign);
  std::string oom_message(std::size_t requested, std::size_t rounded, std::size_t segment) const;
  const std::string* intern(const std::string& owner);

  std::unique_ptr<RawAllocator> raw_;
  std::string device_name_;
  AllocatorKind kind_ = AllocatorKind::Caching;
  mutable std::mutex mutex_;
  std::unique_ptr<Pool> small_, large_;
  MemoryStats stats_;
  std::unordered_map<std::string, std::unique_ptr<std::string>> owners_;
  std::unordered_map<const std::string*, Stat> owner_bytes_;
  std::function<void(const TraceEvent&)> trace_;
  std::function<void(const AllocatorSnapshot&, std::size_t)> oom_observer_;
  uint64_t segments_made_ = 0;
  std::map<uint64_t, Block*> segment_heads_;  // each segment's block at offset 0
  bool replica_ = false;                      // a replica owns the blocks it was built with
  // Expandable: one segment per pool (small, large), reserved on first use.
  std::unique_ptr<Expandable> expandable_[2];
  // Planned: the arena and the stretch under way.
  char* arena_ = nullptr;
  std::size_t arena_size_ = 0;
  bool stretch_ = false, recording_ = false, broken_ = false;
  std::shared_ptr<const ArenaLayout> layout_;
  std::size_t request_ = 0;           // the stretch's next request
  std::vector<Block*> stretch_live_;  // recording: its allocations in order (null once freed)
  std::size_t arena_live_ = 0;        // arena blocks allocated
  std::uintptr_t fake_next_ = 0;      // recording: the next address of no arena
};

// Rounding and segment-size rules, exposed for tests and the planner's closed form.
std::size_t round_size(std::size_t bytes);
std::size_t segment_size_for(std::size_t rounded);

}  // namespace hr::core
