// CUDA embedding lookup, its backward and image patchify: the twins of backend/cpu/embedding.cpp. The backward
// sorts the keys (id, position) (a bitonic network, bitonic.h, in the workspace), so that each id's
// positions lie together and in order; the block at the start of each id's run adds the run's gradient rows into
// that table row, one thread per column, in position order. No two threads add into one element and every element
// receives its sums in the CPU's order: the same bits as the twin, every run, with the tokens spread over the GPU
// instead of walked by one thread per column.
#include "core/backend/cuda/bitonic.h"
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/first_index.cuh"
#include "core/backend/cuda/launch.cuh"

namespace hr::cuda {

namespace {

using device::load;
using device::store;

__device__ unsigned long long g_bad_id;  // the first position whose id is outside the vocabulary

template <typename I>
__global__ void check_ids_kernel(const I* ids, long long n, long long vocab) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && (ids[i] < 0 || ids[i] >= vocab)) atomicMin(&g_bad_id, (unsigned long long)i);
}

template <typename I>
void check_ids(const I* ids, const Tensor& t, int64_t vocab, const char* op) {
  const int64_t n = t.numel();
  if (n == 0) return;
  clear_first_index(g_bad_id);
  launch_elements(op, n, check_ids_kernel<I>, ids, n, vocab);
  const unsigned long long bad = first_index(g_bad_id);
  HR_CHECK(bad == kNoIndex, "[", op, "] id ", index_at(t, bad), " at position ", bad, " is outside the vocabulary [0, ",
           vocab, ")");
}

// Rows are moved as elements of the table's width (2 or 4 bytes): no conversion.
template <typename E, typename I>
__global__ void gather_kernel(const I* ids, const E* table, E* out, long long n, long long dim) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * dim) return;
  const long long i = t / dim, c = t % dim;
  out[t] = table[(long long)ids[i] * dim + c];
}

using Key = unsigned long long;
constexpr Key kPadKey = ~Key(0);  // after every real key

// keys[i] = id[i] << 32 | i for the n tokens (ids and positions below 2^32, checked by the launch), kPadKey beyond
// them up to the padded length: sorted, each id's positions lie together and in order.
constexpr int kPositionBits = 32;
template <typename I>
__global__ void embedding_keys_kernel(const I* ids, Key* keys, long long n, long long length) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < length) keys[i] = i < n ? Key(ids[i]) << kPositionBits | Key(i) : kPadKey;
}

__device__ __forceinline__ void compare_swap(Key& a, Key& b, bool ascending) {
  if ((a > b) == ascending) {
    const Key t = a;
    a = b;
    b = t;
  }
}

// A shared-memory pass (bitonic.h: Sort or Finish): block b holds chunk b, one thread per pair.
__global__ void bitonic_shared_kernel(Key* keys, long long chunk, long long first_size, long long last_size) {
  __shared__ Key s[kBitonicChunk];
  const long long base = (long long)blockIdx.x * chunk, t = threadIdx.x, half = chunk / 2;
  s[t] = keys[base + t];
  s[t + half] = keys[base + t + half];
  __syncthreads();
  bitonic_chunk_steps(first_size, last_size, chunk, [&](int64_t size, int64_t stride) {
    const BitonicPair p = bitonic_pair(t, size, stride, base);
    compare_swap(s[p.i], s[p.j], p.ascending);
    __syncthreads();
  });
  keys[base + t] = s[t];
  keys[base + t + half] = s[t + half];
}

// A global step (size, stride): one thread per pair of the whole array.
__global__ void bitonic_global_kernel(Key* keys, long long pairs, long long size, long long stride) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= pairs) return;
  const BitonicPair p = bitonic_pair(t, size, stride, 0);
  compare_swap(keys[p.i], keys[p.j], p.ascending);
}

// Block (j, column tile): where sorted key j starts its id's run, that table row's columns receive the run's
// gradient rows, in position order, each add rounded to the table's type as the CPU twin's is. The adds of a run
// are one chain per column, so a long run (an image placeholder or padding id over most of the batch) is walked by
// one block: its loads come kRunBatch at a time (the keys, then the gradient rows they name) before the chain adds
// them, so that the walk waits on memory twice a batch instead of twice a position. The sum and its order are the
// same.
constexpr int kRunBatch = 32;
template <typename T, typename G>
__global__ void embedding_add_runs_kernel(const Key* keys, const G* dy, T* dtable, long long n, long long dim) {
  const long long j = blockIdx.x;
  const Key id = keys[j] >> kPositionBits;
  if (j > 0 && keys[j - 1] >> kPositionBits == id) return;  // inside a run: its first key's block adds it
  const long long c = (long long)blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  constexpr Key kPosition = (Key(1) << kPositionBits) - 1;
  T* row = dtable + (long long)id * dim;
  float acc = load(row, c);
  const long long first = (long long)(keys[j] & kPosition);
  for (long long k = j;; k += kRunBatch) {
    // Straight-line code, so that every load of the batch is issued before the first add waits: past the run (or
    // the keys), a lane reads the run's first row again and the add takes nothing from it.
    bool in_run[kRunBatch];
    long long position[kRunBatch];
#pragma unroll
    for (int u = 0; u < kRunBatch; ++u) {
      const Key key = keys[k + u < n ? k + u : n - 1];
      in_run[u] = k + u < n && key >> kPositionBits == id;  // sorted keys: the run's are a prefix of the batch
      position[u] = in_run[u] ? (long long)(key & kPosition) : first;
    }
    float g[kRunBatch];
#pragma unroll
    for (int u = 0; u < kRunBatch; ++u) g[u] = load(dy, position[u] * dim + c);
#pragma unroll
    for (int u = 0; u < kRunBatch; ++u) acc = in_run[u] ? device::round_as<T>(acc + g[u]) : acc;
    if (!in_run[kRunBatch - 1]) break;
  }
  store(row, c, acc);
}

// Sorts the keys (padded to a power of two, `length`) in place.
void sort_keys(Key* keys, int64_t length) {
  const int64_t chunk = bitonic_chunk(length), chunks = length / chunk;
  for (const BitonicStep& s : bitonic_schedule(length)) {
    if (s.kind == BitonicKind::Global)
      launch_elements("embedding_backward", length / 2, bitonic_global_kernel, keys, length / 2, s.size, s.stride);
    else
      launch_kernel(checked_grid("embedding_backward", chunks), dim3(unsigned(chunk / 2)), 0, bitonic_shared_kernel,
                    keys, chunk, s.kind == BitonicKind::Sort ? int64_t(2) : s.size, s.size);
  }
}

template <typename E>
__global__ void patchify_kernel(E* img, E* pat, long long total, long long ch, long long h, long long w, long long p,
                                bool inverse) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= total) return;
  // t walks the patches tensor (n, gh * gw, ch * p * p) in order.
  const long long gw = w / p, gh = h / p, pd = ch * p * p;
  const long long e = t % pd, g = (t / pd) % (gh * gw), n = t / (pd * gh * gw);
  const long long c = e / (p * p), y = (e / p) % p, x = e % p;
  const long long src = ((n * ch + c) * h + (g / gw) * p + y) * w + (g % gw) * p + x;
  if (inverse)
    img[src] = pat[t];
  else
    pat[t] = img[src];
}

template <typename F>
void by_width(std::size_t bytes, const char* op, F&& f) {
  if (bytes == 2)
    f(static_cast<unsigned short>(0));
  else if (bytes == 4)
    f(0.f);
  else
    throw Error(str("[", op, "] unsupported element size ", bytes, " on CUDA"));
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const int64_t n = ids.numel(), vocab = table.size(0), dim = table.size(1);
  dispatch_index(ids.dtype(), "embedding", [&](auto itag) {
    using I = decltype(itag);
    const I* id = ids.data<I>();
    check_ids(id, ids, vocab, "embedding");
    by_width(table.element_size(), "embedding", [&](auto etag) {
      using E = decltype(etag);
      launch_elements("embedding", n * dim, gather_kernel<E, I>, id, static_cast<const E*>(table.data_ptr()),
                      static_cast<E*>(out.data_ptr()), n, dim);
    });
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable, const Tensor& workspace) {
  const int64_t n = ids.numel(), vocab = dtable.size(0), dim = dtable.size(1);
  dispatch_index(ids.dtype(), "embedding_backward", [&](auto itag) {
    using I = decltype(itag);
    const I* id = ids.data<I>();
    check_ids(id, ids, vocab, "embedding_backward");
    if (n * dim == 0) return;
    HR_CHECK(n < (int64_t(1) << 32) && vocab <= (int64_t(1) << 32), "[embedding_backward] ", n, " tokens over ", vocab,
             " ids: the CUDA kernel sorts (id, position) in 64 bits, 32 each");
    const int64_t length = bitonic_length(n);
    HR_CHECK(workspace.nbytes() >= std::size_t(length) * sizeof(Key),
             "[embedding_backward] the workspace is smaller than its sizing rule");
    Key* keys = static_cast<Key*>(workspace.data_ptr());
    launch_elements("embedding_backward", length, embedding_keys_kernel<I>, id, keys, n, length);
    sort_keys(keys, length);
    dispatch_float(dtable.dtype(), "embedding_backward", [&](auto tag) {
      using T = decltype(tag);
      dispatch_float(dy.dtype(), "embedding_backward", [&](auto gtag) {
        using G = decltype(gtag);
        launch_kernel(checked_grid("embedding_backward", n, blocks_of(dim, kThreads)), dim3(kThreads), 0,
                      embedding_add_runs_kernel<T, G>, keys, dy.data<G>(), dtable.data<T>(), n, dim);
      });
    });
  });
}

void patchify(const Tensor& images, const Tensor& patches, int64_t p, PatchDirection direction) {
  const bool inverse = direction == PatchDirection::ToImages;
  const int64_t total = patches.numel();
  if (total == 0) return;
  by_width(images.element_size(), "patchify", [&](auto etag) {
    using E = decltype(etag);
    launch_elements("patchify", total, patchify_kernel<E>, static_cast<E*>(images.data_ptr()),
                    static_cast<E*>(patches.data_ptr()), total, images.size(1), images.size(2), images.size(3), p,
                    inverse);
  });
}

namespace {

// One thread per output element sums its token's entries in entry order, in f32: the CPU twin's order and bits.
template <typename T>
__global__ void mix_rows_kernel(const T* src, const T* extra, const long long* begin, const long long* row,
                                const float* weight, T* out, long long tokens, long long dim) {
  const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= tokens * dim) return;
  const long long t = e / dim, c = e % dim;
  float acc = 0.f;
  for (long long k = begin[t]; k < begin[t + 1]; ++k)
    acc += weight[k] * (row[k] < 0 ? load(extra, c) : load(src, row[k] * dim + c));
  store(out, e, acc);
}

}  // namespace

void mix_rows(const MixArgs& a) {
  const int64_t tokens = a.out.size(0), dim = a.out.size(1);
  dispatch_float(a.src.dtype(), "mix_rows", [&](auto tag) {
    using T = decltype(tag);
    launch_elements("mix_rows", tokens * dim, mix_rows_kernel<T>, a.src.data<T>(),
                    a.extra.defined() ? a.extra.data<T>() : nullptr,
                    reinterpret_cast<const long long*>(a.begin.data<int64_t>()),
                    reinterpret_cast<const long long*>(a.row.data<int64_t>()), a.weight.data<float>(), a.out.data<T>(),
                    (long long)tokens, (long long)dim);
  });
}

}  // namespace hr::cuda
