// HR_HOST_DEVICE for a translation unit the C++ compiler compiles: plain C++. core/host_device/cuda has the same
// names for nvcc; core/CMakeLists.txt picks the directory by each source's language.
#pragma once

#define HR_HOST_DEVICE
#define HR_EXEC_CHECK_DISABLE
