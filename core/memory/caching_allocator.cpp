// CachingAllocator: pools, best fit, split and merge, retry-then-OOM, stats by category and owner.
#include "core/memory/caching_allocator.h"

#include <algorithm>

#include "core/memory/arena_plan.h"
#include "core/memory/caching_allocator_blocks.h"

namespace hr::core {

const char* allocator_kind_name(AllocatorKind k) {
  switch (k) {
    case AllocatorKind::Caching:
      return "caching";
    case AllocatorKind::Expandable:
      return "expandable";
    case AllocatorKind::Planned:
      return "planned";
  }
  return "?";
}

bool BlockLess::operator()(const CachingAllocator::Block* a, const CachingAllocator::Block* b) const {
  std::size_t sa = CachingAllocator::block_size(a), sb = CachingAllocator::block_size(b);
  if (sa != sb) return sa < sb;
  return CachingAllocator::position(a) < CachingAllocator::position(b);
}

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

CachingAllocator::CachingAllocator(std::unique_ptr<RawAllocator> raw, std::string device_name, AllocatorKind kind)
    : raw_(std::move(raw)),
      device_name_(std::move(device_name)),
      kind_(kind),
      small_(new Pool{true, {}}),
      large_(new Pool{false, {}}) {
  HR_CHECK(kind_ != AllocatorKind::Expandable || raw_->page_size() == kPageSize, "[memory] ", device_name_, " (",
           raw_->name(), ") cannot map pages: memory.allocator: expandable is not available on it");
}

CachingAllocator::CachingAllocator(const AllocatorSnapshot& state, std::unique_ptr<RawAllocator> raw,
                                   std::string device_name)
    : CachingAllocator(std::move(raw), std::move(device_name), state.kind) {
  replica_ = true;
  HR_ASSERT(state.stretch.empty(), "a replica of an allocator in the middle of a planned stretch");
  for (const AllocatorSnapshot::Segment& seg : state.segments) {
    Pool& pool = seg.small ? *small_ : *large_;
    char* base = nullptr;
    if (seg.expandable) {
      auto e = std::make_unique<Expandable>();
      base = e->base = static_cast<char*>(raw_->reserve(seg.size));
      HR_CHECK(base, "[memory] a replica of ", device_name_, " cannot reserve ", format_bytes(double(seg.size)));
      e->size = seg.size;
      e->mapped.assign(seg.size / kPageSize, 0);
      e->id = seg.id;
      for (const auto& [at, bytes] : seg.mapped) {
        HR_CHECK(raw_->map(base + at, bytes), "[memory] a replica of ", device_name_, " has no room for the pages of ",
                 format_bytes(double(bytes)), " mapped in segment ", seg.id);
        for (std::size_t p = at / kPageSize; p < (at + bytes) / kPageSize; ++p) e->mapped[p] = 1;
        stats_.reserved_bytes.add(int64_t(bytes));
      }
      expandable_[seg.small ? 0 : 1] = std::move(e);
    } else {
      base = static_cast<char*>(raw_->allocate(seg.size));
      HR_CHECK(base, "[memory] a replica of ", device_name_, " has no room for segment ", seg.id, " (",
               format_bytes(double(seg.size)), ")");
      stats_.reserved_bytes.add(int64_t(seg.size));
    }
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
      if (prev)
        prev->next = b;
      else
        segment_heads_[seg.id] = b;
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
        if (b->is_split() && !seg.expandable) {
          stats_.inactive_split_bytes.add(int64_t(b->size));
          stats_.inactive_split.add(1);
        }
      }
    }
  }
  segments_made_ = state.segments_made;
  if (kind_ == AllocatorKind::Expandable) sync_expandable_stats();
  if (state.arena) {
    arena_ = static_cast<char*>(raw_->allocate(state.arena));
    HR_CHECK(arena_, "[memory] a replica of ", device_name_, " has no room for its arena (",
             format_bytes(double(state.arena)), ")");
    arena_size_ = state.arena;
    stats_.reserved_bytes.add(int64_t(arena_size_));
  }
}

CachingAllocator::~CachingAllocator() {
  // Tensors outliving their allocator would be a bug elsewhere; free what is cached, leak nothing we own.
  std::lock_guard<std::mutex> lock(mutex_);
  if (replica_) {
    destroy_replica_locked();
    return;
  }
  release_cached_blocks_locked();
  if (arena_live_ == 0) release_arena();
  release_unused_expandable_locked();
}

// Nobody holds a replica's blocks: every segment goes back whole, expandable ranges unmapped and released.
void CachingAllocator::destroy_replica_locked() {
  for (auto& [id, head] : segment_heads_) {
    char* base = head->ptr;
    const Expandable* e = expandable_[head->pool->is_small ? 0 : 1].get();
    const bool expandable = e && e->id == id;  // its range is released below
    std::size_t size = 0;
    for (Block* b = head; b;) {
      Block* next = b->next;
      size += b->size;
      delete b;
      b = next;
    }
    if (!expandable) raw_->deallocate(base, size);
  }
  for (auto& e : expandable_) {
    if (!e) continue;
    for (std::size_t p = 0; p < e->mapped.size(); ++p)
      if (e->mapped[p]) raw_->unmap(e->base + p * kPageSize, kPageSize);
    raw_->release(e->base, e->size);
  }
  if (arena_) raw_->deallocate(arena_, arena_size_);
}

// An unused expandable range goes back; one with live blocks stays with them.
void CachingAllocator::release_unused_expandable_locked() {
  for (auto& e : expandable_) {
    if (!e) continue;
    const Block* head = segment_heads_[e->id];
    if (head->next || head->allocated) continue;
    raw_->release(e->base, e->size);
    segment_heads_.erase(e->id);
    delete head;
  }
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
  const auto same_segment_all = [&](const Segment& a, const Segment& b) {
    return same_segment(a, b) && a.expandable == b.expandable && a.mapped == b.mapped;
  };
  return kind == o.kind && segments_made == o.segments_made && arena == o.arena &&
         std::equal(segments.begin(), segments.end(), o.segments.begin(), o.segments.end(), same_segment_all) &&
         std::equal(stretch.begin(), stretch.end(), o.stretch.begin(), o.stretch.end(), same_block);
}

AllocatorSnapshot CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return snapshot_locked();
}

AllocatorSnapshot CachingAllocator::snapshot_locked() const {
  AllocatorSnapshot s;
  s.kind = kind_;
  s.segments_made = segments_made_;
  s.arena = arena_size_;
  if (stretch_)
    for (const Block* b : stretch_live_)
      if (b) s.stretch.push_back({0, b->size, b->requested, true, b->category, b->owner ? *b->owner : ""});
  for (const auto& [id, head] : segment_heads_) s.segments.push_back(snapshot_segment(id, head));
  return s;
}

// One segment's blocks and, for an expandable one, its mapped ranges (adjacent pages merged).
AllocatorSnapshot::Segment CachingAllocator::snapshot_segment(uint64_t id, const Block* head) const {
  AllocatorSnapshot::Segment seg;
  seg.id = id;
  seg.small = head->pool->is_small;
  const Expandable* e = expandable_[seg.small ? 0 : 1].get();
  if (e && e->id == id) {
    seg.expandable = true;
    for (std::size_t p = 0; p < e->mapped.size(); ++p) {
      if (!e->mapped[p]) continue;
      if (!seg.mapped.empty() && seg.mapped.back().first + seg.mapped.back().second == p * kPageSize)
        seg.mapped.back().second += kPageSize;
      else
        seg.mapped.push_back({p * kPageSize, kPageSize});
    }
  }
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
  return seg;
}

void* CachingAllocator::data(const Block* b) {
  return b->ptr;
}
std::pair<uint64_t, std::size_t> CachingAllocator::position(const Block* b) {
  return {b->segment, b->offset};
}
std::size_t CachingAllocator::block_size(const Block* b) {
  return b->size;
}

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
  // Planned: a cached block serves only a request of its size, so that nothing kept (states) ever sits in a
  // segment a freed temporary left, and releasing the cache leaves exactly the live blocks reserved.
  if (kind_ == AllocatorKind::Planned && b->size != size) return nullptr;
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
  if (stretch_ && !broken_)
    if (Block* b = stretch_alloc(bytes, size, tag)) return b;
  return malloc_segments_locked(bytes, size, tag);
}

[[noreturn]] void CachingAllocator::out_of_memory(std::size_t bytes, std::size_t size, std::size_t seg,
                                                  const MemoryTag& tag) {
  ++stats_.num_ooms;
  if (trace_) trace_({TraceEvent::Kind::OOM, size, bytes, tag.category, intern(tag.owner)});
  if (oom_observer_) oom_observer_(snapshot_locked(), bytes);
  throw OutOfMemory(oom_message(bytes, size, seg), bytes);
}

CachingAllocator::Block* CachingAllocator::malloc_segments_locked(std::size_t bytes, std::size_t size,
                                                                  const MemoryTag& tag) {
  Pool& pool = size <= kSmallSize ? *small_ : *large_;
  Block* block = nullptr;
  if (kind_ == AllocatorKind::Expandable) {
    block = malloc_expandable(pool, size, tag, bytes);
  } else {
    // Planned: segments of exactly the request (and cached blocks reused only at their size, find_free_block).
    const std::size_t seg = kind_ == AllocatorKind::Planned ? size : segment_size_for(size);
    block = find_free_block(pool, size);
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
      if (!block) out_of_memory(bytes, size, seg, tag);
    }
    split_block(pool, block, size);
  }
  block->allocated = true;
  block->requested = bytes;
  block->category = tag.category;
  block->owner = intern(tag.owner);
  account(block, +1);
  if (kind_ == AllocatorKind::Expandable) sync_expandable_stats();
  if (trace_) trace_({TraceEvent::Kind::Alloc, block->size, bytes, block->category, block->owner, block});
  return block;
}

void CachingAllocator::split_block(Pool& pool, Block* block, std::size_t size) {
  // Caching: split when enough remains, any 512 B in the small pool, more than 1 MiB in the large pool. The
  // other kinds always split (a remainder costs nothing there: it is mapped on demand or exactly sized).
  const std::size_t remaining = block->size - size;
  const bool split =
      kind_ != AllocatorKind::Caching || pool.is_small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (!split) return;
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
  if (kind_ != AllocatorKind::Expandable) {
    stats_.inactive_split_bytes.add(int64_t(remaining));
    stats_.inactive_split.add(1);
  }
}

// ---- expandable segments ----

CachingAllocator::Block* CachingAllocator::malloc_expandable(Pool& pool, std::size_t size, const MemoryTag& tag,
                                                             std::size_t bytes) {
  std::unique_ptr<Expandable>& slot = expandable_[pool.is_small ? 0 : 1];
  if (!slot) {
    const std::size_t range = raw_->reservable() / kPageSize * kPageSize;
    if (range == 0) out_of_memory(bytes, size, kPageSize, tag);  // a capacity under one page holds nothing
    void* base = raw_->reserve(range);
    HR_CHECK(base, "[memory] ", device_name_, ": cannot reserve ", format_bytes(double(range)),
             " of addresses for an expandable segment");
    slot = std::make_unique<Expandable>();
    slot->base = static_cast<char*>(base);
    slot->size = range;
    slot->mapped.assign(range / kPageSize, 0);
    Block* b = new Block;
    b->size = range;
    b->ptr = slot->base;
    b->segment = slot->id = ++segments_made_;
    b->pool = &pool;
    segment_heads_[b->segment] = b;
    pool.free_blocks.insert(b);
    stats_.segment.add(1);
  }
  Expandable& e = *slot;
  for (int attempt = 0;; ++attempt) {
    // The free block that needs the fewest new pages; among those the best fit, then the lowest place.
    Block key;
    key.size = size;
    Block* best = nullptr;
    std::size_t fewest = SIZE_MAX;
    for (auto it = pool.free_blocks.lower_bound(&key); it != pool.free_blocks.end() && fewest; ++it) {
      const std::size_t m = e.missing((*it)->offset, size);
      if (m < fewest) best = *it, fewest = m;
    }
    if (best && (fewest == 0 || map_range(e, best->offset, size))) {
      pool.free_blocks.erase(best);
      split_block(pool, best, size);
      return best;
    }
    if (attempt == 1) out_of_memory(bytes, size, size, tag);
    if (trace_) trace_({TraceEvent::Kind::Retry, size, bytes, tag.category, intern(tag.owner)});
    release_cached_blocks_locked();
    ++stats_.num_alloc_retries;
  }
}

bool CachingAllocator::map_range(Expandable& e, std::size_t offset, std::size_t bytes) {
  const std::size_t first = offset / kPageSize, last = (offset + bytes - 1) / kPageSize;
  for (std::size_t p = first; p <= last;) {
    if (e.mapped[p]) {
      ++p;
      continue;
    }
    std::size_t q = p;
    while (q <= last && !e.mapped[q]) ++q;
    if (!raw_->map(e.base + p * kPageSize, (q - p) * kPageSize)) return false;
    for (std::size_t k = p; k < q; ++k) e.mapped[k] = 1;
    stats_.reserved_bytes.add(int64_t((q - p) * kPageSize));
    if (trace_)
      trace_({TraceEvent::Kind::SegmentAlloc, (q - p) * kPageSize, 0, Category::Activations, nullptr, nullptr});
    p = q;
  }
  return true;
}

void CachingAllocator::unmap_unused(Expandable& e) {
  std::vector<uint8_t> used(e.mapped.size(), 0);
  for (const Block* b = segment_heads_[e.id]; b; b = b->next)
    if (b->allocated)
      for (std::size_t p = b->offset / kPageSize; p <= (b->offset + b->size - 1) / kPageSize; ++p) used[p] = 1;
  for (std::size_t p = 0; p < e.mapped.size();) {
    if (!e.mapped[p] || used[p]) {
      ++p;
      continue;
    }
    std::size_t q = p;
    while (q < e.mapped.size() && e.mapped[q] && !used[q]) e.mapped[q++] = 0;
    raw_->unmap(e.base + p * kPageSize, (q - p) * kPageSize);
    stats_.reserved_bytes.add(-int64_t((q - p) * kPageSize));
    if (trace_)
      trace_({TraceEvent::Kind::SegmentFree, (q - p) * kPageSize, 0, Category::Activations, nullptr, nullptr});
    p = q;
  }
  sync_expandable_stats();
}

void CachingAllocator::sync_expandable_stats() {
  // Mapped bytes no block holds: the expandable segments' cache (their split blocks are free address space).
  const int64_t cached = stats_.reserved_bytes.current - stats_.allocated_bytes.current;
  stats_.inactive_split_bytes.add(cached - stats_.inactive_split_bytes.current);
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
  if ((stretch_ || !block->pool) && stretch_free(block)) return;
  if (trace_) trace_({TraceEvent::Kind::Free, block->size, block->requested, block->category, block->owner, block});
  account(block, -1);
  block->allocated = false;
  block->requested = 0;
  Pool& pool = *block->pool;

  // Merge with free neighbours; each was an inactive split block.
  for (Block* nb : {block->prev, block->next}) {
    if (!nb || nb->allocated) continue;
    pool.free_blocks.erase(nb);
    if (kind_ != AllocatorKind::Expandable) {
      stats_.inactive_split_bytes.add(-int64_t(nb->size));
      stats_.inactive_split.add(-1);
    }
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
  if (kind_ == AllocatorKind::Expandable) {
    sync_expandable_stats();
  } else if (block->is_split()) {
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
  if (kind_ == AllocatorKind::Expandable) {
    for (auto& e : expandable_)
      if (e) unmap_unused(*e);
    return;
  }
  release_pool(*small_);
  release_pool(*large_);
  if (!stretch_) release_arena();  // outside a stretch the arena is cache like any other
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_blocks_locked();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s : {&stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes, &stats_.inactive_split_bytes,
                  &stats_.requested_bytes, &stats_.allocation, &stats_.segment, &stats_.inactive_split})
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
