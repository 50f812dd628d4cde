// cuBLAS, cuBLASLt and NVRTC open when the CUDA back-end first calls them (core/backend/cuda/cuda_libraries.h):
// a run on the CPU never loads them, each forwarder reaches its library's own function, and a library that cannot
// be opened is an error naming it. Runs without a GPU: the calls here need none (NVRTC compiles on the host, the
// cuBLASLt descriptors are host objects, and a null handle is an answer cuBLAS gives without a device).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <gtest/gtest.h>
#include <nvrtc.h>

#include <fstream>
#include <string>
#include <vector>

#include "core/backend/cuda/cuda_libraries.h"
#include "core/check.h"
#include "integration/cli.h"

using namespace hr;

namespace {

bool mapped(const std::string& file) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("/" + file) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(CudaLibraries, ACpuRunOfHeadroomLoadsNoneOfThem) {
  // The dynamic loader's own account of every library it opens, for a step of training on the CPU.
  const std::string dir = testing_cli::fresh_dir("cpu_run");
  { std::ofstream(dir + "/cfg.yaml") << testing_cli::kTinyTrainConfig; }
  const auto r = testing_cli::run("LD_DEBUG=files " + std::string(HR_HEADROOM_BIN) + " train " + dir +
                                  "/cfg.yaml --set train.max_steps=1 --set run.output_dir=" + dir + "/out");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("file=libcudart.so"), std::string::npos) << "LD_DEBUG lists no libraries:\n" << r.output;
  for (cuda::Library lib : cuda::kLibraries)
    EXPECT_EQ(r.output.find("file=" + cuda::library_file(lib)), std::string::npos)
        << cuda::library_file(lib) << " was loaded by a run on the CPU";
}

TEST(CudaLibraries, InfoSaysWhereEachIsFound) {
  const auto r = testing_cli::run(std::string(HR_HEADROOM_BIN) + " info");
  ASSERT_EQ(r.status, 0) << r.output;
  for (cuda::Library lib : cuda::kLibraries) {
    const std::string line = str("  ", cuda::library_name(lib), ": ", cuda::library_file(lib), " (/");
    EXPECT_NE(r.output.find(line), std::string::npos) << "no '" << line << "' in:\n" << r.output;
  }
}

TEST(CudaLibraries, CublasForwardersReachTheLibrary) {
  // The status strings come from the library; a null handle is refused by the function that was asked.
  const std::string unsupported = cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(unsupported.find("not supported"), std::string::npos) << unsupported;
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_SUCCESS)), unsupported);
  EXPECT_TRUE(mapped(cuda::library_file(cuda::Library::Cublas)));
  EXPECT_EQ(cublasSetStream(nullptr, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasSetWorkspace(nullptr, nullptr, 0), CUBLAS_STATUS_NOT_INITIALIZED);
  const float one = 1;
  EXPECT_EQ(cublasGemmStridedBatchedEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, nullptr, CUDA_R_32F, 1, 0,
                                       nullptr, CUDA_R_32F, 1, 0, &one, nullptr, CUDA_R_32F, 1, 0, 1,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST(CudaLibraries, CublasLtDescriptorsRoundTripThroughTheLibrary) {
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64), CUBLAS_STATUS_SUCCESS);
  EXPECT_TRUE(mapped(cuda::library_file(cuda::Library::CublasLt)));
  const int batch = 3;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
            CUBLAS_STATUS_SUCCESS);
  // An attribute of the wrong size is the library's to refuse.
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const size_t workspace = 1 << 20;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                 sizeof workspace),
            CUBLAS_STATUS_SUCCESS);
  // Without a handle (creating one needs a GPU) the heuristic and the GEMM refuse.
  cublasLtMatmulHeuristicResult_t result{};
  int found = -1;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, desc, layout, layout, layout, layout, pref, 1, &result, &found),
            CUBLAS_STATUS_NOT_INITIALIZED);
  const float one = 1;
  EXPECT_EQ(cublasLtMatmul(nullptr, desc, &one, nullptr, layout, nullptr, layout, &one, nullptr, layout, nullptr,
                           layout, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
}

TEST(CudaLibraries, NvrtcCompilesAKernelThroughTheForwarders) {
  const char* src = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n";
  nvrtcProgram prog = nullptr;
  ASSERT_EQ(nvrtcCreateProgram(&prog, src, "twice.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
  EXPECT_TRUE(mapped(cuda::library_file(cuda::Library::Nvrtc)));
  const char* options[] = {"--gpu-architecture=sm_90"};
  ASSERT_EQ(nvrtcCompileProgram(prog, 1, options), NVRTC_SUCCESS);
  size_t log_size = 0;
  ASSERT_EQ(nvrtcGetProgramLogSize(prog, &log_size), NVRTC_SUCCESS);
  std::vector<char> log(log_size + 1);
  EXPECT_EQ(nvrtcGetProgramLog(prog, log.data()), NVRTC_SUCCESS);
  size_t cubin_size = 0;
  ASSERT_EQ(nvrtcGetCUBINSize(prog, &cubin_size), NVRTC_SUCCESS);
  ASSERT_GT(cubin_size, 4u);
  std::vector<char> cubin(cubin_size);
  ASSERT_EQ(nvrtcGetCUBIN(prog, cubin.data()), NVRTC_SUCCESS);
  EXPECT_EQ(std::string(cubin.data(), 4),
            "\x7f"
            "ELF");
  EXPECT_NE(std::string(cubin.begin(), cubin.end()).find("twice"), std::string::npos);
  EXPECT_EQ(nvrtcDestroyProgram(&prog), NVRTC_SUCCESS);
  EXPECT_EQ(prog, nullptr);
  // A program that does not compile comes back as the library's error with its log.
  ASSERT_EQ(nvrtcCreateProgram(&prog, "this is not CUDA", "bad.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
  EXPECT_EQ(nvrtcCompileProgram(prog, 1, options), NVRTC_ERROR_COMPILATION);
  ASSERT_EQ(nvrtcGetProgramLogSize(prog, &log_size), NVRTC_SUCCESS);
  log.assign(log_size + 1, 0);
  ASSERT_EQ(nvrtcGetProgramLog(prog, log.data()), NVRTC_SUCCESS);
  EXPECT_NE(std::string(log.data()).find("bad.cu"), std::string::npos) << log.data();
  nvrtcDestroyProgram(&prog);
}

TEST(CudaLibraries, ALibraryThatCannotBeOpenedIsAnErrorNamingIt) {
  try {
    cuda::open_library("libcublasLt.so.999", "the test's GEMMs");
    FAIL() << "opened a library that does not exist";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot open libcublasLt.so.999 (for the test's GEMMs): "), std::string::npos) << m;
    EXPECT_NE(m.find("LD_LIBRARY_PATH"), std::string::npos) << m;
  }
  EXPECT_THROW(cuda::library_symbol(cuda::Library::CublasLt, "cublasLtNoSuchFunction"), Error);
  // The two forwarders no test can call without a GPU (creating a handle needs one) resolve all the same.
  EXPECT_NE(cuda::library_symbol(cuda::Library::Cublas, "cublasCreate_v2"), nullptr);
  EXPECT_NE(cuda::library_symbol(cuda::Library::CublasLt, "cublasLtCreate"), nullptr);
}
