// The arena plan's placements run in an OpenMP region: an allocation failing inside one (host memory exhausted)
// reaches the caller as std::bad_alloc, as it did before they ran in parallel, rather than ending the process.
// This binary replaces the global operator new and delete so that a test can make every allocation inside a
// parallel region fail; nothing else runs here.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "core/memory/arena_plan.h"

namespace {

std::atomic<bool> fail_in_parallel{false};
std::atomic<int> failed{0};

void* allocate(std::size_t n) {
  if (fail_in_parallel.load() && omp_in_parallel()) {
    ++failed;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t n) {
  return allocate(n);
}
void* operator new[](std::size_t n) {
  return allocate(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return operator new(n, t);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

using namespace hr::core;

TEST(ArenaPlanOom, AnAllocationFailingInAParallelPlacementReachesTheCaller) {
  std::vector<Lifetime> buffers;
  for (std::size_t i = 0; i < 200; ++i) buffers.push_back({512 * (1 + i % 7), i, i + 1 + i % 5});
  omp_set_num_threads(2);
  std::size_t arena = 0;
  const std::vector<std::size_t> fine = pack_buffers(buffers, &arena);
  ASSERT_EQ(fine.size(), buffers.size());
  fail_in_parallel = true;
  EXPECT_THROW(pack_buffers(buffers, &arena), std::bad_alloc);
  fail_in_parallel = false;
  EXPECT_GT(failed.load(), 0) << "no allocation failed inside a parallel region: the test tested nothing";
  std::size_t again = 0;
  EXPECT_EQ(pack_buffers(buffers, &again), fine);  // nothing left broken
  EXPECT_EQ(again, arena);
}
