// The hooks data/stb_impl.cpp compiles stb with (see data/stb.h). Only the PNG and JPEG decoders are
// built: the formats headroom reads, and less code reading untrusted bytes. The fuzz and sanitizer builds
// instrument them with the rest of headroom.
#include "data/stb.h"

#include <cstdint>
#include <cstdlib>
#include <new>

namespace hr::data::stb {

namespace {
// Each block carries a header linking it into its thread's list of live blocks.
struct alignas(std::max_align_t) Block {
  Block* prev;
  Block* next;
  std::size_t bytes;
};

struct LiveList {
  Block head{&head, &head, 0};
  std::size_t bytes = 0;
  bool in_scope = false;
};
thread_local LiveList live;

void link(Block* b) {
  b->prev = live.head.prev;
  b->next = &live.head;
  live.head.prev->next = b;
  live.head.prev = b;
  live.bytes += b->bytes;
}

void unlink(Block* b) {
  b->prev->next = b->next;
  b->next->prev = b->prev;
  live.bytes -= b->bytes;
}
}  // namespace

StbAssertion::StbAssertion(const char* expression)
    : Error(str("stb_image's internal check `", expression, "` failed")), expression_(expression) {}

void assertion_failed(const char* expression) {
  throw StbAssertion(expression);
}

DecodeScope::DecodeScope() {
  HR_ASSERT(!live.in_scope, "stb decode scopes do not nest");
  live.in_scope = true;
}

DecodeScope::~DecodeScope() {
  while (live.head.next != &live.head) {
    Block* b = live.head.next;
    unlink(b);
    std::free(b);
  }
  live.in_scope = false;
}

std::size_t live_bytes() {
  return live.bytes;
}

void* allocate(std::size_t bytes) {
  if (bytes > SIZE_MAX - sizeof(Block)) return nullptr;
  // Zeroed: stb reads some of its tables before writing them when the input is corrupt.
  auto* b = static_cast<Block*>(std::calloc(1, sizeof(Block) + bytes));
  if (!b) return nullptr;  // stb reports "outofmem"
  b->bytes = bytes;
  link(b);
  return b + 1;
}

void release(void* p) {
  if (!p) return;
  Block* b = static_cast<Block*>(p) - 1;
  unlink(b);
  std::free(b);
}

void* reallocate(void* p, std::size_t bytes) {
  if (!p) return allocate(bytes);
  if (bytes > SIZE_MAX - sizeof(Block)) return nullptr;
  Block* b = static_cast<Block*>(p) - 1;
  unlink(b);
  auto* moved = static_cast<Block*>(std::realloc(b, sizeof(Block) + bytes));
  if (!moved) {  // the old block is still valid and still stb's
    link(b);
    return nullptr;
  }
  moved->bytes = bytes;
  link(moved);
  return moved + 1;
}

}  // namespace hr::data::stb
