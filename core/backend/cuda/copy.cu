// CUDA fill and copy: cudaMemcpy for same-dtype contiguous data (any direction), a strided converting
// kernel on the device otherwise.
#include <cstring>
#include <type_traits>

#include "core/backend/cuda/cuda_common.h"
#include "core/backend/cuda/cuda_kernels.h"
#include "core/backend/cuda/device/dtype.cuh"
#include "core/backend/cuda/launch.cuh"

namespace hr::cuda {

namespace {

constexpr int kMaxDims = 8;

struct Layout {
  int dims;
  long long shape[kMaxDims];
  long long strides[kMaxDims];
};

Layout layout_of(const Tensor& t) {
  HR_CHECK(t.dim() <= kMaxDims, "[copy] at most ", kMaxDims, " dims on CUDA; got ", t.describe());
  Layout l{t.dim(), {}, {}};
  for (int i = 0; i < t.dim(); ++i) {
    l.shape[i] = t.shape()[i];
    l.strides[i] = t.strides()[i];
  }
  return l;
}

__device__ long long offset_of(const Layout& l, long long linear) {
  long long off = 0;
  for (int d = l.dims - 1; d >= 0; --d) {
    off += (linear % l.shape[d]) * l.strides[d];
    linear /= l.shape[d];
  }
  return off;
}

template <typename D, typename S>
__global__ void copy_kernel(D* dst, Layout dl, const S* src, Layout sl, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  device::store(dst, offset_of(dl, i), device::load(src, offset_of(sl, i)));
}

// Integer tensors (ids, labels, quantized blobs) copy strided without a cast.
template <typename T>
__global__ void copy_int_kernel(T* dst, Layout dl, const T* src, Layout sl, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[offset_of(dl, i)] = src[offset_of(sl, i)];
}

template <typename T>
__global__ void fill_kernel(T* out, Layout l, long long n, float v) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) device::store(out, offset_of(l, i), v);
}

template <typename T>
__global__ void fill_int_kernel(T* out, Layout l, long long n, T v) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[offset_of(l, i)] = v;
}

bool on_gpu(const Tensor& t) {
  return t.device().type == core::DeviceType::CUDA;
}

}  // namespace

void fill(const Tensor& out, float value) {
  const long long n = out.numel();
  Layout l = layout_of(out);
  switch (out.dtype()) {
    case DType::I32:
      launch_elements("fill", n, fill_int_kernel<int32_t>, out.data<int32_t>(), l, n, int32_t(value));
      break;
    case DType::I64:
      launch_elements("fill", n, fill_int_kernel<int64_t>, out.data<int64_t>(), l, n, int64_t(value));
      break;
    case DType::U8:
      launch_elements("fill", n, fill_int_kernel<uint8_t>, out.data<uint8_t>(), l, n, uint8_t(value));
      break;
    default:
      dispatch_float(out.dtype(), "fill", [&](auto tag) {
        using T = decltype(tag);
        launch_elements("fill", n, fill_kernel<T>, out.data<T>(), l, n, value);
      });
  }
  HR_CUDA_CHECK(cudaGetLastError());
}

// A plain copy between host and device waits for the transfer (the host side may be freed or read right after);
// copy_async leaves it running on the stream, for callers that keep both sides alive until the stream syncs.
void copy_async(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    HR_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDefault, stream()));
    return;
  }
  copy(dst, src);
}

namespace {

// The side stream of the current device (non-blocking: the legacy compute stream does not wait for it) and the
// event that orders it after the compute stream.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t queued = nullptr;
};

SideStream& side_stream() {
  constexpr int kMaxDevices = 64;
  static SideStream streams[kMaxDevices];
  int device = 0;
  HR_CUDA_CHECK(cudaGetDevice(&device));
  HR_CHECK(device >= 0 && device < kMaxDevices, "[copy_side] device ", device, " out of range");
  SideStream& s = streams[device];
  if (!s.stream) {
    HR_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    HR_CUDA_CHECK(cudaEventCreateWithFlags(&s.queued, cudaEventDisableTiming));
  }
  return s;
}

}  // namespace

void copy_side(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() != src.dtype() || !dst.is_contiguous() || !src.is_contiguous()) return copy(dst, src);
  SideStream& s = side_stream();
  HR_CUDA_CHECK(cudaEventRecord(s.queued, stream()));  // what the compute stream wrote into src first
  HR_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.queued, 0));
  HR_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDefault, s.stream));
}

void side_sync() {
  HR_CUDA_CHECK(cudaStreamSynchronize(side_stream().stream));
}

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;  // nothing to move (an empty tensor may have no memory at all)
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    HR_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDefault, stream()));
    // Host memory may be read, freed or reused as soon as this returns; device memory is ordered by the stream.
    if (!on_gpu(dst) || !on_gpu(src)) HR_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return;
  }
  HR_CHECK(on_gpu(dst) && on_gpu(src),
           "[copy] a copy between host and CUDA needs contiguous tensors of one dtype; got ", dst.describe(), " <- ",
           src.describe(), " (cast or make contiguous on one side first)");
  const long long n = dst.numel();
  Layout dl = layout_of(dst), sl = layout_of(src);
  if (!core::is_float(dst.dtype()) || !core::is_float(src.dtype())) {
    HR_CHECK(dst.dtype() == src.dtype(),
             "[copy] casts between integer and float tensors are not on CUDA: ", dst.describe(), " <- ",
             src.describe());
    const auto run = [&](auto* d, const auto* s) {
      launch_elements("copy", n, copy_int_kernel<std::remove_const_t<std::remove_pointer_t<decltype(s)>>>, d, dl, s, sl,
                      n);
    };
    switch (dst.dtype()) {
      case DType::I32:
        run(dst.data<int32_t>(), src.data<int32_t>());
        break;
      case DType::I64:
        run(dst.data<int64_t>(), src.data<int64_t>());
        break;
      case DType::U8:
        run(dst.data<uint8_t>(), src.data<uint8_t>());
        break;
      default:
        HR_CHECK(false, "[copy] unsupported dtype ", dst.describe());
    }
    HR_CUDA_CHECK(cudaGetLastError());
    return;
  }
  dispatch_float(dst.dtype(), "copy", [&](auto dtag) {
    dispatch_float(src.dtype(), "copy", [&](auto stag) {
      using D = decltype(dtag);
      using S = decltype(stag);
      launch_elements("copy", n, copy_kernel<D, S>, dst.data<D>(), dl, src.data<S>(), sl, n);
    });
  });
  HR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hr::cuda
