// CachingAllocator: pools, best fit, split and merge, retry-then-OOM, stats by category and owner.
#include "core/memory/caching_allocator.h"

#include <algorithm>

namespace hr::core {

struct CachingAllocator::Block {
  std::size_t size = 0;       // rounded block size
  std::size_t requested = 0;  // caller's bytes while allocated
  char* ptr = nullptr;
  uint64_t segment = 0;     // which segment (in the order they were obtained)
  std::size_t offset = 0;   // offset in it
  Pool* pool = nullptr;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours within the same segment
  Block* next = nullptr;
  Category category = Category::Activations;
  const std::string* owner = nullptr;
  bool is_split() const { return prev || next; }
};

namespace {
struct BlockLess {
  bool operator()(const CachingAllocator::Block* a, const CachingAllocator::Block* b) const;
};
}  // namespace

struct CachingAllocator::Pool {
  bool is_small;
  std::set<Block*, BlockLess> free_blocks;  // ordered by (size, address): lower_bound is best fit
};

namespace {
bool BlockLess::operator()(const CachingAllocator::Block* a, const CachingAllocator::Block* b) const {
  std::size_t sa = CachingAllocator::block_size(a), sb = CachingAllocator::block_size(b);
  if (sa != sb) return sa < sb;
  return CachingAllocator::position(a) < CachingAllocator::position(b);
}
}  // namespace

std::size_t round_size(std::size_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::size_t segment_size_for(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

double MemoryStats::fragmentation() const {
  if (reserved_bytes.current == 0) return 0.0;
  return 1.0 - double(allocated_bytes.current) / double(reserved_bytes.current);
}

CachingAllocator::CachingAllocator(std::unique_ptr<RawAllocator> raw, std::string device_name)
    : raw_(std::move(raw)),
      device_name_(std::move(device_name)),
      small_(new Pool{true, {}}),
      large_(new Pool{false, {}}) {}

CachingAllocator::CachingAllocator(const AllocatorSnapshot& state, std::unique_ptr<RawAllocator> raw,
                                   std::string device_name)
    : CachingAllocator(std::move(raw), std::move(device_name)) {
  replica_ = true;
  for (const AllocatorSnapshot::Segment& seg : state.segments) {
    char* base = static_cast<char*>(raw_->allocate(seg.size));
    HR_CHECK(base, "[memory] a replica of ", device_name_, " has no room for segment ", seg.id, " (",
             format_bytes(double(seg.size)), ")");
    Pool& pool = seg.small ? *small_ : *large_;
    stats_.reserved_bytes.add(int64_t(seg.size));
    stats_.segment.add(1);
    Block* prev = nullptr;
    for (const AllocatorSnapshot::Block& sb : seg.blocks) {
      Block* b = new Block;
      b->size = sb.size;
      b->ptr = base + sb.offset;
      b->segment = seg.id;
      b->offset = sb.offset;
      b->pool = &pool;
      b->prev = prev;
      if (prev) prev->next = b;
      else segment_heads_[seg.id] = b;
      prev = b;
    }
    // Tags and accounting once the neighbours are linked (a free block counts as split by its neighbours).
    std::size_t i = 0;
    for (Block* b = segment_heads_[seg.id]; b; b = b->next, ++i) {
      const AllocatorSnapshot::Block& sb = seg.blocks[i];
      if (sb.allocated) {
        b->allocated = true;
        b->requested = sb.requested;
        b->category = sb.category;
        b->owner = intern(sb.owner);
        account(b, +1);
      } else {
        pool.free_blocks.insert(b);
        if (b->is_split()) {
          stats_.inactive_split_bytes.add(int64_t(b->size));
          stats_.inactive_split.add(1);
        }
      }
    }
  }
  segments_made_ = state.segments_made;
}

CachingAllocator::~CachingAllocator() {
  // Tensors outliving their allocator would be a bug elsewhere; free what is cached, leak nothing we own.
  std::lock_guard<std::mutex> lock(mutex_);
  if (replica_) {  // nobody holds a replica's blocks: every segment goes back whole
    for (auto& [id, head] : segment_heads_) {
      char* base = head->ptr;
      std::size_t size = 0;
      for (Block* b = head; b;) {
        Block* next = b->next;
        size += b->size;
        delete b;
        b = next;
      }
      raw_->deallocate(base, size);
    }
    return;
  }
  release_cached_blocks_locked();
}

// Spelled out rather than defaulted: nvcc 13's front end compiles this header too and refuses `= default`
// comparisons.
bool AllocatorSnapshot::operator==(const AllocatorSnapshot& o) const {
  const auto same_block = [](const Block& a, const Block& b) {
    return a.offset == b.offset && a.size == b.size && a.requested == b.requested && a.allocated == b.allocated &&
           a.category == b.category && a.owner == b.owner;
  };
  const auto same_segment = [&](const Segment& a, const Segment& b) {
    return a.id == b.id && a.small == b.small && a.size == b.size &&
           std::equal(a.blocks.begin(), a.blocks.end(), b.blocks.begin(), b.blocks.end(), same_block);
  };
  return segments_made == o.segments_made &&
         std::equal(segments.begin(), segments.end(), o.segments.begin(), o.segments.end(), same_segment);
}

AllocatorSnapshot CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot_locked();
}

AllocatorSnapshot CachingAllocator::snapshot_locked() const {
  AllocatorSnapshot s;
  s.segments_made = segments_made_;
  for (const auto& [id, head] : segment_heads_) {
    AllocatorSnapshot::Segment seg;
    seg.id = id;
    seg.small = head->pool->is_small;
    for (const Block* b = head; b; b = b->next) {
      AllocatorSnapshot::Block sb{b->offset, b->size, 0, b->allocated, Category::Activations, ""};
      if (b->allocated) {  // a cached block keeps its last owner's tags inside; they describe nothing now
        sb.requested = b->requested;
        sb.category = b->category;
        sb.owner = b->owner ? *b->owner : "";
      }
      seg.blocks.push_back(std::move(sb));
      seg.size += b->size;
    }
    s.segments.push_back(std::move(seg));
  }
  return s;
}

void* CachingAllocator::data(const Block* b) { return b->ptr; }
std::pair<uint64_t, std::size_t> CachingAllocator::position(const Block* b) { return {b->segment, b->offset}; }
std::size_t CachingAllocator::block_size(const Block* b) { return b->size; }

const std::string* CachingAllocator::intern(const std::string& owner) {
  auto it = owners_.find(owner);
  if (it != owners_.end()) return it->second.get();
  auto s = std::make_unique<std::string>(owner);
  const std::string* p = s.get();
  owners_.emplace(owner, std::move(s));
  return p;
}

void CachingAllocator::set_oom_observer(std::function<void(const AllocatorSnapshot&, std::size_t)> observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  oom_observer_ = std::move(observer);
}

void CachingAllocator::set_trace(std::function<void(const TraceEvent&)> trace) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_ = std::move(trace);
}

CachingAllocator::Block* CachingAllocator::allocate(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return malloc_locked(bytes);
}

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, std::size_t size) {
  Block key;
  key.size = size;
  auto it = pool.free_blocks.lower_bound(&key);
  if (it == pool.free_blocks.end()) return nullptr;
  Block* b = *it;
  pool.free_blocks.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::alloc_segment(Pool& pool, std::size_t segment_size) {
  void* p = raw_->allocate(segment_size);
  if (!p) return nullptr;
  Block* b = new Block;
  b->size = segment_size;
  b->ptr = static_cast<char*>(p);
  b->segment = ++segments_made_;
  b->pool = &pool;
  segment_heads_[b->segment] = b;
  stats_.reserved_bytes.add(int64_t(segment_size));
  stats_.segment.add(1);
  if (trace_) trace_({TraceEvent::Kind::SegmentAlloc, segment_size, 0, Category::Activations, nullptr, b});
  return b;
}

CachingAllocator::Block* CachingAllocator::malloc_locked(std::size_t bytes) {
  const MemoryTag& tag = current_memory_tag();
  const std::size_t size = round_size(bytes);
  Pool& pool = size <= kSmallSize ? *small_ : *large_;
  const std::size_t seg = segment_size_for(size);

  Block* block = find_free_block(pool, size);
  if (block) {
    if (block->is_split()) {
      stats_.inactive_split_bytes.add(-int64_t(block->size));
      stats_.inactive_split.add(-1);
    }
  } else {
    block = alloc_segment(pool, seg);
    if (!block) {
      if (trace_) trace_({TraceEvent::Kind::Retry, size, bytes, tag.category, intern(tag.owner)});
      release_cached_blocks_locked();
      ++stats_.num_alloc_retries;
      block = alloc_segment(pool, seg);
    }
    if (!block) {
      ++stats_.num_ooms;
      if (trace_) trace_({TraceEvent::Kind::OOM, size, bytes, tag.category, intern(tag.owner)});
      if (oom_observer_) oom_observer_(snapshot_locked(), bytes);
      throw OutOfMemory(oom_message(bytes, size, seg), bytes);
    }
  }

  // Split when enough remains: any 512 B in the small pool, more than 1 MiB in the large pool.
  const std::size_t remaining = block->size - size;
  const bool split = pool.is_small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    Block* rest = new Block;
    rest->size = remaining;
    rest->ptr = block->ptr + size;
    rest->segment = block->segment;
    rest->offset = block->offset + size;
    rest->pool = &pool;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.free_blocks.insert(rest);
    stats_.inactive_split_bytes.add(int64_t(remaining));
    stats_.inactive_split.add(1);
  }

  block->allocated = true;
  block->requested = bytes;
  block->category = tag.category;
  block->owner = intern(tag.owner);
  account(block, +1);
  if (trace_) trace_({TraceEvent::Kind::Alloc, block->size, bytes, block->category, block->owner, block});
  return block;
}

void CachingAllocator::account(Block* b, int sign) {
  const int64_t s = sign * int64_t(b->size);
  const bool new_peak = stats_.allocated_bytes.current + s > stats_.allocated_bytes.peak;
  stats_.allocated_bytes.add(s);
  stats_.active_bytes.add(s);
  stats_.requested_bytes.add(sign * int64_t(b->requested));
  stats_.allocation.add(sign);
  stats_.by_category[std::size_t(b->category)].add(s);
  owner_bytes_[b->owner].add(s);
  if (new_peak)
    for (Category c : kAllCategories) stats_.at_peak[std::size_t(c)] = stats_.category(c).current;
}

void CachingAllocator::free(Block* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_locked(block);
}

void CachingAllocator::free_locked(Block* block) {
  HR_ASSERT(block->allocated, "double free of a block on ", device_name_);
  if (trace_) trace_({TraceEvent::Kind::Free, block->size, block->requested, block->category, block->owner, block});
  account(block, -1);
  block->allocated = false;
  block->requested = 0;
  Pool& pool = *block->pool;

  // Merge with free neighbours; each was an inactive split block.
  for (Block* nb : {block->prev, block->next}) {
    if (!nb || nb->allocated) continue;
    pool.free_blocks.erase(nb);
    stats_.inactive_split_bytes.add(-int64_t(nb->size));
    stats_.inactive_split.add(-1);
    if (nb == block->prev) {
      if (!nb->prev) segment_heads_[nb->segment] = block;
      block->ptr = nb->ptr;
      block->offset = nb->offset;
      block->prev = nb->prev;
      if (block->prev) block->prev->next = block;
    } else {
      block->next = nb->next;
      if (block->next) block->next->prev = block;
    }
    block->size += nb->size;
    delete nb;
  }
  if (block->is_split()) {
    stats_.inactive_split_bytes.add(int64_t(block->size));
    stats_.inactive_split.add(1);
  }
  pool.free_blocks.insert(block);
}

void CachingAllocator::release_pool(Pool& pool) {
  for (auto it = pool.free_blocks.begin(); it != pool.free_blocks.end();) {
    Block* b = *it;
    if (b->is_split()) {
      ++it;
      continue;
    }
    it = pool.free_blocks.erase(it);
    segment_heads_.erase(b->segment);
    raw_->deallocate(b->ptr, b->size);
    stats_.reserved_bytes.add(-int64_t(b->size));
    stats_.segment.add(-1);
    if (trace_) trace_({TraceEvent::Kind::SegmentFree, b->size, 0, Category::Activations, nullptr, b});
    delete b;
  }
}

void CachingAllocator::release_cached_blocks_locked() {
  release_pool(*small_);
  release_pool(*large_);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_blocks_locked();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s : {&stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                  &stats_.inactive_split_bytes, &stats_.requested_bytes, &stats_.allocation,
                  &stats_.segment, &stats_.inactive_split})
    s->reset_peak();
  for (Stat& s : stats_.by_category) s.reset_peak();
  for (Category c : kAllCategories) stats_.at_peak[std::size_t(c)] = stats_.category(c).current;
  for (auto& [owner, s] : owner_bytes_) s.reset_peak();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::unordered_map<std::string, Stat> CachingAllocator::owner_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::unordered_map<std::string, Stat> out;
  for (const auto& [owner, s] : owner_bytes_) out[*owner] = s;
  return out;
}

}  // namespace hr::core
