// The cuBLAS, cuBLASLt and NVRTC functions headroom calls, each opening its library on first use (see
// cuda_libraries.h for why). Every definition below repeats the header's declaration, so a signature that drifts
// from the toolkit's headers does not compile ("conflicting declaration of C function"); the library itself is
// reached through dlopen and dlsym, whose handle searches that library and those it needs, never these forwarders.
#include "core/backend/cuda/cuda_libraries.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <nvrtc.h>

#include <iterator>
#include <mutex>

#include "core/check.h"

namespace hr::cuda {

namespace {

const char* needed_by(Library lib) {
  switch (lib) {
    case Library::Cublas:
      return "the CUDA back-end's GEMMs (cuBLAS)";
    case Library::CublasLt:
      return "the CUDA back-end's GEMMs (cuBLASLt)";
    case Library::Nvrtc:
      return "cuDNN's fused attention, whose runtime-compiled engines NVRTC compiles";
  }
  return "the CUDA back-end";
}

}  // namespace

const char* library_name(Library lib) {
  switch (lib) {
    case Library::Cublas:
      return "cuBLAS";
    case Library::CublasLt:
      return "cuBLASLt";
    case Library::Nvrtc:
      return "NVRTC";
  }
  return "?";
}

std::string library_file(Library lib) {
  switch (lib) {
    case Library::Cublas:
      return str("libcublas.so.", CUBLAS_VER_MAJOR);
    case Library::CublasLt:
      return str("libcublasLt.so.", CUBLAS_VER_MAJOR);
    case Library::Nvrtc:
      return str("libnvrtc.so.", CUDART_VERSION / 1000);
  }
  return {};
}

void* open_library(const std::string& file, const char* what) {
  if (void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* why = dlerror();
  throw Error(str("[cuda] cannot open ", file, " (for ", what, "): ", why ? why : "no reason given",
                  ". Put the CUDA toolkit's library directory (or the lib directory of the nvidia-* wheel that ",
                  "holds it) on LD_LIBRARY_PATH."));
}

void* library(Library lib) {
  static std::mutex mutex;
  static void* handles[std::size(kLibraries)] = {};
  std::lock_guard<std::mutex> lock(mutex);
  void*& h = handles[static_cast<int>(lib)];
  if (!h) h = open_library(library_file(lib), needed_by(lib));
  return h;
}

Found library_found(Library lib) {
  try {
    link_map* map = nullptr;
    if (dlinfo(library(lib), RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name)
      return {true, map->l_name};
    return {true, library_file(lib)};
  } catch (const Error& e) {
    return {false, e.what()};
  }
}

void* library_symbol(Library lib, const char* name) {
  void* h = library(lib);
  dlerror();
  if (void* f = dlsym(h, name)) return f;
  const char* why = dlerror();
  throw Error(str("[cuda] ", library_file(lib), " has no function ", name, ": ", why ? why : "no reason given",
                  " (a toolkit older than the headers headroom was built with?)"));
}

}  // namespace hr::cuda

// One forwarder: the header's return type, name, parameters (with names) and the arguments passed on.
#define HR_FORWARD(lib, ret, name, params, args)                                                             \
  extern "C" ret name params {                                                                               \
    using Function = ret(*) params; /* not decltype(&name): a C++ overload may share the name */             \
    static const auto real = reinterpret_cast<Function>(::hr::cuda::library_symbol(::hr::cuda::lib, #name)); \
    return real args;                                                                                        \
  }

HR_FORWARD(Library::Cublas, cublasStatus_t, cublasCreate_v2, (cublasHandle_t * handle), (handle))
HR_FORWARD(Library::Cublas, cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream),
           (handle, stream))
HR_FORWARD(Library::Cublas, cublasStatus_t, cublasSetWorkspace_v2,
           (cublasHandle_t handle, void* workspace, size_t bytes), (handle, workspace, bytes))
HR_FORWARD(Library::Cublas, const char*, cublasGetStatusString, (cublasStatus_t status), (status))
HR_FORWARD(Library::Cublas, cublasStatus_t, cublasGemmStridedBatchedEx,
           (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
            const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
            cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
            long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo),
           (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc,
            strideC, batchCount, computeType, algo))

HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmul,
           (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
            cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
            cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
            void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream),
           (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspaceSizeInBytes,
            stream))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
           (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
            cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
            cublasLtMatmulPreference_t preference, int requestedAlgoCount,
            cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
           (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount, heuristicResultsArray,
            returnAlgoCount))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmulDescCreate,
           (cublasLtMatmulDesc_t * desc, cublasComputeType_t computeType, cudaDataType_t scaleType),
           (desc, computeType, scaleType))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmulDescSetAttribute,
           (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t sizeInBytes),
           (desc, attr, buf, sizeInBytes))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref),
           (pref))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref),
           (pref))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
           (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
            size_t sizeInBytes),
           (pref, attr, buf, sizeInBytes))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatrixLayoutCreate,
           (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
           (layout, type, rows, cols, ld))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
HR_FORWARD(Library::CublasLt, cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
           (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t sizeInBytes),
           (layout, attr, buf, sizeInBytes))

HR_FORWARD(Library::Nvrtc, nvrtcResult, nvrtcCreateProgram,
           (nvrtcProgram * prog, const char* src, const char* name, int numHeaders, const char* const* headers,
            const char* const* includeNames),
           (prog, src, name, numHeaders, headers, includeNames))
HR_FORWARD(Library::Nvrtc, nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram * prog), (prog))
HR_FORWARD(Library::Nvrtc, nvrtcResult, nvrtcCompileProgram,
           (nvrtcProgram prog, int numOptions, const char* const* options), (prog, numOptions, options))
HR_FORWARD(Library::Nvrtc, nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram prog, size_t* cubinSizeRet),
           (prog, cubinSizeRet))
HR_FORWARD(Library::Nvrtc, nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram prog, char* cubin), (prog, cubin))
HR_FORWARD(Library::Nvrtc, nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t* logSizeRet),
           (prog, logSizeRet))
HR_FORWARD(Library::Nvrtc, nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram prog, char* log), (prog, log))
