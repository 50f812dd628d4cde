// HR_HOST_DEVICE: a function both back-ends run, compiled for the GPU as well where nvcc compiles it (dropout's
// mask, the bitonic network's pairs); plain C++ everywhere else.
#pragma once

#if defined(__CUDACC__)
#define HR_HOST_DEVICE __host__ __device__
#else
#define HR_HOST_DEVICE
#endif
