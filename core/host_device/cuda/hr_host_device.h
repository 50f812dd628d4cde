// HR_HOST_DEVICE for a translation unit nvcc compiles: a function both back-ends run is compiled for the GPU as well
// (dropout's mask, the bitonic network's pairs). core/CMakeLists.txt puts this directory on the include path of CUDA
// sources and core/host_device/cxx (the same names, plain C++) on that of C++ sources.
#pragma once

#define HR_HOST_DEVICE __host__ __device__
// Before a host-device template whose argument may be a device-only callable (a kernel's lambda with its barrier).
#define HR_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
