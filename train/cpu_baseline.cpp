// The CPU baseline check. headroom is compiled for HR_CPU_BASELINE (x86-64-v3 by default: AVX2, FMA, BMI2), so on
// an older CPU its first vector instruction would end it with SIGILL and no word why. This file alone is compiled
// for plain x86-64 (train/CMakeLists.txt) and runs before any other constructor or main.
#include <cstdio>
#include <cstdlib>

#if defined(HR_CHECK_X86_64_V3)
namespace {

__attribute__((constructor(101))) void check_cpu_baseline() {
  __builtin_cpu_init();
  const char* missing = !__builtin_cpu_supports("avx2")   ? "AVX2"
                        : !__builtin_cpu_supports("fma")  ? "FMA"
                        : !__builtin_cpu_supports("bmi")  ? "BMI1"
                        : !__builtin_cpu_supports("bmi2") ? "BMI2"
                                                          : nullptr;
  if (!missing) return;
  std::fprintf(stderr,
               "headroom: this build is for x86-64-v3 CPUs (AVX2, FMA, BMI2) and this CPU has no %s; rebuild with "
               "-DHR_CPU_BASELINE=x86-64 for a build that runs on any x86-64 CPU\n",
               missing);
  std::_Exit(1);
}

}  // namespace
#endif
