// The parts of device_info.h that need no CUDA.
#include "core/backend/device_info.h"

#include "core/check.h"

namespace hr::core {

std::string cuda_version_text(int v) {
  return v <= 0 ? std::string("none") : str(v / 1000, ".", (v % 1000) / 10);
}

}  // namespace hr::core
