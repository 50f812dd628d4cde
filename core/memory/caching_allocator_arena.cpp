// CachingAllocator's planned stretches (memory.allocator: planned): a step's requests recorded once, laid out
// in one arena by the plan, then served from it at the planned offsets; what the layout does not cover falls
// back to the pools.
#include <algorithm>

#include "core/memory/arena_plan.h"
#include "core/memory/caching_allocator_blocks.h"

namespace hr::core {

void CachingAllocator::begin_stretch(std::shared_ptr<const ArenaLayout> layout) {
  std::lock_guard<std::mutex> lock(mutex_);
  HR_CHECK(kind_ == AllocatorKind::Planned, "[memory] ", device_name_, " runs the ", allocator_kind_name(kind_),
           " allocator: only memory.allocator: planned follows a plan");
  HR_ASSERT(!stretch_, "a planned stretch begun inside another");
  HR_CHECK(layout || !raw_->real(), "[memory] ", device_name_,
           ": a stretch without a plan records, which only the meta device can");
  if (layout && !grow_arena(layout->arena)) {
    const MemoryTag tag{Category::Activations, "arena"};
    out_of_memory(layout->arena, layout->arena, layout->arena, tag);
  }
  stretch_ = true;
  recording_ = !layout;
  broken_ = false;
  layout_ = std::move(layout);
  request_ = 0;
  stretch_live_.clear();
  fake_next_ = std::uintptr_t(1) << 44;
}

bool CachingAllocator::grow_arena(std::size_t bytes) {
  if (bytes <= arena_size_) return true;
  release_arena();
  void* p = raw_->allocate(bytes);
  if (!p) {
    if (trace_) trace_({TraceEvent::Kind::Retry, bytes, bytes, Category::Activations, intern("arena")});
    release_cached_blocks_locked();
    ++stats_.num_alloc_retries;
    p = raw_->allocate(bytes);
  }
  if (!p) return false;
  arena_ = static_cast<char*>(p);
  arena_size_ = bytes;
  stats_.reserved_bytes.add(int64_t(bytes));
  stats_.segment.add(1);
  if (trace_) trace_({TraceEvent::Kind::SegmentAlloc, bytes, 0, Category::Activations, nullptr, nullptr});
  return true;
}

void CachingAllocator::release_arena() {
  if (!arena_) return;
  raw_->deallocate(arena_, arena_size_);
  stats_.reserved_bytes.add(-int64_t(arena_size_));
  stats_.segment.add(-1);
  if (trace_) trace_({TraceEvent::Kind::SegmentFree, arena_size_, 0, Category::Activations, nullptr, nullptr});
  arena_ = nullptr;
  arena_size_ = 0;
}

CachingAllocator::Block* CachingAllocator::stretch_alloc(std::size_t bytes, std::size_t size, const MemoryTag& tag) {
  const std::size_t r = request_++;
  Block* b = nullptr;
  if (recording_) {
    b = new Block;
    b->ptr = reinterpret_cast<char*>(fake_next_);
    fake_next_ += size;
  } else {
    const ArenaLayout::Entry e = r < layout_->requests ? layout_->at(r) : ArenaLayout::Entry{false, 0, 0};
    if (!e.alloc || e.bytes != size) {
      broken_ = true;
      return nullptr;
    }
    if (e.offset == ArenaLayout::kPersistent) return nullptr;
    b = new Block;
    b->ptr = arena_ + e.offset;
    b->offset = e.offset;
    b->arena = true;
    ++arena_live_;
  }
  b->size = size;
  b->index = stretch_live_.size();
  stretch_live_.push_back(b);
  b->allocated = true;
  b->requested = bytes;
  b->category = tag.category;
  b->owner = intern(tag.owner);
  account(b, +1);
  if (trace_) trace_({TraceEvent::Kind::Alloc, b->size, bytes, b->category, b->owner, b});
  return b;
}

bool CachingAllocator::stretch_free(Block* block) {
  if (stretch_ && !broken_) {
    const std::size_t r = request_++;
    if (!recording_ && (r >= layout_->requests || layout_->at(r).alloc)) broken_ = true;
  }
  if (block->pool) return false;
  if (trace_) trace_({TraceEvent::Kind::Free, block->size, block->requested, block->category, block->owner, block});
  account(block, -1);
  if (block->arena) --arena_live_;
  if (block->index < stretch_live_.size() && stretch_live_[block->index] == block)
    stretch_live_[block->index] = nullptr;
  delete block;
  return true;
}

void CachingAllocator::skip_requests(std::size_t requests) {
  std::lock_guard<std::mutex> lock(mutex_);
  request_ += requests;
}

std::size_t CachingAllocator::arena_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_size_;
}

bool CachingAllocator::stretch_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stretch_;
}

bool CachingAllocator::stretch_broken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

std::size_t CachingAllocator::arena_size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_size_;
}

void CachingAllocator::end_stretch(std::shared_ptr<const ArenaLayout> layout) {
  std::lock_guard<std::mutex> lock(mutex_);
  HR_ASSERT(stretch_, "end of a planned stretch that was not begun");
  stretch_ = false;
  layout_.reset();
  std::vector<Block*> live;
  for (Block* b : stretch_live_)
    if (b) live.push_back(b);
  stretch_live_.clear();
  if (!recording_) {
    if (arena_live_) retire_arena(std::move(live));
    return;
  }
  recording_ = false;
  HR_ASSERT(layout, "a recorded stretch ends without the layout worked out from it");
  // As a stretch that followed the layout: the arena first, then what stays allocated gets its segments in order.
  auto trace = std::move(trace_);
  trace_ = nullptr;
  try {
    if (!grow_arena(layout->arena))
      out_of_memory(layout->arena, layout->arena, layout->arena, {Category::Activations, "arena"});
    for (Block* b : live) adopt(b);
  } catch (...) {
    trace_ = std::move(trace);
    throw;
  }
  trace_ = std::move(trace);
}

void CachingAllocator::adopt(Block* b) {
  // Place it as a request outside a stretch, then put `b` where that placement's block is.
  account(b, -1);
  Block* nb = nullptr;
  try {
    nb = malloc_segments_locked(b->requested, b->size, {b->category, b->owner ? *b->owner : ""});
  } catch (...) {
    account(b, +1);
    throw;
  }
  b->ptr = nb->ptr;
  b->segment = nb->segment;
  b->offset = nb->offset;
  b->pool = nb->pool;
  b->prev = nb->prev;
  b->next = nb->next;
  if (b->prev)
    b->prev->next = b;
  else
    segment_heads_[b->segment] = b;
  if (b->next) b->next->prev = b;
  delete nb;
}

void CachingAllocator::retire_arena(std::vector<Block*> live) {
  // Blocks the plan expected freed are still allocated (a broken plan): the arena becomes an ordinary segment
  // holding them, and the next stretch gets a new one.
  std::sort(live.begin(), live.end(), [](const Block* a, const Block* b) { return a->offset < b->offset; });
  const uint64_t id = ++segments_made_;
  Pool& pool = arena_size_ <= kSmallSize ? *small_ : *large_;
  Block* prev = nullptr;
  std::vector<Block*> gaps;
  const auto link = [&](Block* b) {
    b->prev = prev;
    b->next = nullptr;
    if (prev)
      prev->next = b;
    else
      segment_heads_[id] = b;
    prev = b;
    b->segment = id;
    b->pool = &pool;
    b->arena = false;
  };
  const auto gap = [&](std::size_t from, std::size_t to) {
    if (to <= from) return;
    Block* f = new Block;
    f->size = to - from;
    f->ptr = arena_ + from;
    f->offset = from;
    link(f);
    gaps.push_back(f);
  };
  std::size_t at = 0;
  for (Block* b : live) {
    gap(at, b->offset);
    link(b);
    at = b->offset + b->size;
  }
  gap(at, arena_size_);
  for (Block* f : gaps) {
    pool.free_blocks.insert(f);
    stats_.inactive_split_bytes.add(int64_t(f->size));
    stats_.inactive_split.add(1);
  }
  arena_ = nullptr;
  arena_size_ = 0;
  arena_live_ = 0;
}

}  // namespace hr::core
