// Nothing a kernel uses escapes the caching allocator. This binary replaces malloc and its relatives (they
// forward to glibc's) so that every heap allocation made while a kernel runs, from any thread, is seen: every
// op of the op table (forward and backward, f32 and bf16) and one training step of every strategy run once to
// warm up (oneDNN primitives, OpenMP's thread team) and once watched. A kernel may not allocate memory of
// its own: what it works in is an output, a workspace or a scratchpad the op allocated before the call. Each
// allocation is attributed to whoever asked for it (the first caller past operator new and libc): headroom's
// own code may ask for nothing; the runtimes a kernel runs on may keep per-call records of at most
// kRuntimeRecordBytes each (oneDNN's execution context, 104 B; the OpenMP runtime's team record for a
// one-thread region, 1,568 B), whose size does not grow with the tensors. A library that packs operands in
// buffers of its own (oneDNN's gemm:jit: 33 KB to 6.6 MB per call) fails here. The test command runs this
// under every oneDNN ISA level the CPU supports.
#include <dlfcn.h>
#include <execinfo.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <map>

#include "core/memory/device_memory.h"
#include "core/ops/dispatch.h"
#include "op_cases.h"
#include "step_cases.h"

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {

constexpr std::size_t kRuntimeRecordBytes = 4096;  // the largest runtime record allowed per allocation
constexpr int kMaxRecords = 4096;
constexpr int kFrames = 6;  // malloc, its caller, and who called that (operator new's caller, ...)

struct Record {
  std::size_t bytes;
  int frames;
  void* frame[kFrames];
};

std::atomic<bool> g_watching{false};
std::atomic<int> g_count{0};
Record g_records[kMaxRecords];
thread_local bool t_inside = false;  // backtrace() itself must not be watched

// Runs inside malloc: no allocation of its own (backtrace is warmed up before anything is watched).
inline void note(std::size_t bytes) {
  if (!g_watching.load(std::memory_order_relaxed) || t_inside) return;
  t_inside = true;
  const int i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i < kMaxRecords) {
    g_records[i].bytes = bytes;
    g_records[i].frames = backtrace(g_records[i].frame, kFrames);
  }
  t_inside = false;
}

// The first backtrace loads the unwinder (which allocates): done once, before any watch.
const bool g_unwinder_ready = [] {
  void* f[2];
  return backtrace(f, 2) > 0;
}();

}  // namespace

extern "C" {
void* malloc(size_t n) {
  note(n);
  return __libc_malloc(n);
}
void free(void* p) {
  __libc_free(p);
}
void* calloc(size_t a, size_t b) {
  note(a * b);
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  note(n);
  return __libc_realloc(p, n);
}
int posix_memalign(void** p, size_t alignment, size_t n) {
  note(n);
  *p = __libc_memalign(alignment, n);
  return *p ? 0 : ENOMEM;
}
void* aligned_alloc(size_t alignment, size_t n) {
  note(n);
  return __libc_memalign(alignment, n);
}
void* memalign(size_t alignment, size_t n) {
  note(n);
  return __libc_memalign(alignment, n);
}
}

namespace {

using namespace hr;
using namespace hr::core;

std::string library_of(void* address) {
  Dl_info info;
  if (!dladdr(address, &info) || !info.dli_fname) return "?";
  std::string name = info.dli_fname;
  return name.substr(name.rfind('/') + 1);
}

bool is_plumbing(const std::string& lib) {  // libraries that only pass a request on (operator new, ...)
  return lib.rfind("libstdc++", 0) == 0 || lib.rfind("libc.so", 0) == 0 || lib.rfind("libgcc_s", 0) == 0;
}

// Who asked for the memory: the first frame past malloc (frame 0, in this binary) that is not plumbing.
// headroom's own code is linked into this binary, so a frame here means headroom allocated.
std::string requester(const Record& r) {
  static const std::string self = library_of(reinterpret_cast<void*>(&library_of));
  for (int f = 1; f < r.frames; ++f) {
    const std::string lib = library_of(r.frame[f]);
    if (is_plumbing(lib)) continue;
    return lib == self ? std::string("headroom") : lib;
  }
  return "?";
}

// What the kernels of one run allocated behind the allocator's back, by kernel.
struct Escape {
  std::string kernel, library;
  std::size_t bytes;
};

class Watch : public KernelObserver {
 public:
  Watch() { set_kernel_observer(this); }
  ~Watch() override { set_kernel_observer(nullptr); }
  void enter(const char*) override {
    g_count.store(0);
    g_watching.store(true);
  }
  void leave(const char* op) override {
    g_watching.store(false);
    const int n = std::min(g_count.load(), kMaxRecords);
    for (int i = 0; i < n; ++i) seen.push_back({op, requester(g_records[i]), g_records[i].bytes});
    overflow |= g_count.load() > kMaxRecords;
  }
  std::vector<Escape> seen;
  bool overflow = false;
};

// Fails on anything headroom's code allocated or any runtime allocation larger than a record.
void check(const std::string& what, const Watch& w) {
  EXPECT_FALSE(w.overflow) << what << ": more than " << kMaxRecords << " allocations in one kernel";
  std::map<std::string, std::pair<int, std::size_t>> by;  // kernel @ requester -> count, largest
  for (const Escape& e : w.seen) {
    auto& s = by[e.kernel + " @ " + e.library];
    ++s.first;
    s.second = std::max(s.second, e.bytes);
  }
  for (const auto& [where, s] : by) {
    const bool ours = where.ends_with("@ headroom");
    EXPECT_FALSE(ours) << what << ": " << where << " allocated " << s.first << " times (largest " << s.second
                       << " B) while a kernel ran: kernels take their memory from the op";
    EXPECT_LE(s.second, kRuntimeRecordBytes) << what << ": " << where << " allocated " << s.second
                                             << " B while a kernel ran: a buffer out of the allocator's sight";
  }
}

class OpEscapes : public testing::TestWithParam<std::tuple<std::string, DType>> {};

std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const auto& c : hr::test::op_cases()) n.push_back(c.name);
  return n;
}

const hr::test::OpCase& find(const std::string& name) {
  static const std::vector<hr::test::OpCase> cases = hr::test::op_cases();
  for (const auto& c : cases)
    if (c.name == name) return c;
  throw Error("no case " + name);
}

}  // namespace

TEST_P(OpEscapes, KernelsAllocateNothingOfTheirOwn) {
  const hr::test::OpCase& c = find(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  auto run = [&] {
    std::vector<Tensor> t = hr::test::make_tensors(c, hr::test::rounded_inputs(c, dt), dt, Device::cpu());
    Tensor out = c.forward(t);
    if (c.backward) c.backward(t, Tensor::full(out.shape(), 0.5f, out.dtype(), Device::cpu()));
  };
  run();
  Watch w;
  run();
  check(c.name + " " + dtype_name(dt), w);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpEscapes,
                         testing::Combine(testing::ValuesIn(case_names()), testing::Values(DType::F32, DType::BF16)),
                         [](const auto& p) { return std::get<0>(p.param) + "_" + dtype_name(std::get<1>(p.param)); });

class StepEscapes : public testing::TestWithParam<hr::test::StepCase> {};

TEST_P(StepEscapes, KernelsOfATrainingStepAllocateNothingOfTheirOwn) {
  configure_device(Device::cpu(), {});
  hr::test::StepEngine engine(GetParam(), Device::cpu());
  engine.step();
  Watch w;
  engine.step();
  check(GetParam().name, w);
}

INSTANTIATE_TEST_SUITE_P(Strategies, StepEscapes, testing::ValuesIn(hr::test::step_cases()),
                         [](const auto& p) { return p.param.name; });
