// CUDA embedding lookup, its backward and image patchify: the twins of backend/cpu/embedding.cpp. The backward
// gives each thread one column of the table and walks the tokens in order, so no two threads add into one
// element and the sums come out in the CPU's order (no float atomics, the same bits every run).
#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/first_index.cuh"

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
  check_ids_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ids, n, vocab);
  HR_CUDA_CHECK(cudaGetLastError());
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

template <typename T, typename G, typename I>
__global__ void scatter_add_kernel(const I* ids, const G* dy, T* dtable, long long n, long long dim) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  for (long long i = 0; i < n; ++i) {
    const long long o = (long long)ids[i] * dim + c;
    store(dtable, o, load(dtable, o) + load(dy, i * dim + c));
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
    if (n * dim == 0) return;
    by_width(table.element_size(), "embedding", [&](auto etag) {
      using E = decltype(etag);
      gather_kernel<<<blocks_for(n * dim), kThreads, 0, stream()>>>(id, static_cast<const E*>(table.data_ptr()),
                                                                    static_cast<E*>(out.data_ptr()), n, dim);
    });
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dtable) {
  const int64_t n = ids.numel(), vocab = dtable.size(0), dim = dtable.size(1);
  dispatch_index(ids.dtype(), "embedding_backward", [&](auto itag) {
    using I = decltype(itag);
    const I* id = ids.data<I>();
    check_ids(id, ids, vocab, "embedding_backward");
    if (n * dim == 0) return;
    dispatch_float(dtable.dtype(), "embedding_backward", [&](auto tag) {
      using T = decltype(tag);
      dispatch_float(dy.dtype(), "embedding_backward", [&](auto gtag) {
        using G = decltype(gtag);
        scatter_add_kernel<<<blocks_for(dim), kThreads, 0, stream()>>>(id, dy.data<G>(), dtable.data<T>(), n, dim);
      });
    });
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

void patchify(const Tensor& images, const Tensor& patches, int64_t p, bool inverse) {
  const int64_t total = patches.numel();
  if (total == 0) return;
  by_width(images.element_size(), "patchify", [&](auto etag) {
    using E = decltype(etag);
    patchify_kernel<<<blocks_for(total), kThreads, 0, stream()>>>(
        static_cast<E*>(images.data_ptr()), static_cast<E*>(patches.data_ptr()), total, images.size(1), images.size(2),
        images.size(3), p, inverse);
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hr::cuda
