// The CPU baseline check. headroom is compiled for HR_CPU_BASELINE (x86-64-v3 by default: AVX2, FMA, BMI2), so on
// an older CPU its first vector instruction would end it with SIGILL and no word why. This file alone is compiled
// for plain x86-64 (train/CMakeLists.txt) and runs before any other constructor or main.
#if defined(HR_CHECK_X86_64_V3)
#include <cpuid.h>

#include <cstdio>
#include <cstdlib>

namespace {

// The first of x86-64-v3's features (beside the older levels') that this CPU, its hypervisor or its OS does not
// offer, from CPUID (as GCC's and clang's own checks read it; clang 14 knows no "x86-64-v3" for
// __builtin_cpu_supports), or null.
const char* missing_x86_64_v3_feature() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return "CPUID leaf 1";
  const unsigned ecx1 = c;
  struct Bit {
    unsigned reg, bit;
    const char* name;
  };
  const Bit leaf1[] = {{ecx1, 20, "SSE4.2"}, {ecx1, 23, "POPCNT"}, {ecx1, 28, "AVX"},    {ecx1, 12, "FMA"},
                       {ecx1, 29, "F16C"},   {ecx1, 22, "MOVBE"},  {ecx1, 27, "OSXSAVE"}};
  for (const Bit& f : leaf1)
    if (!(f.reg >> f.bit & 1u)) return f.name;
  unsigned lo, hi;                                           // XCR0: the OS saves the SSE and AVX registers
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));  // only now that OSXSAVE says it exists
  if ((lo & 6u) != 6u) return "the OS's support for the AVX registers (XCR0)";
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "CPUID leaf 7";
  const Bit leaf7[] = {{b, 5, "AVX2"}, {b, 3, "BMI1"}, {b, 8, "BMI2"}};
  for (const Bit& f : leaf7)
    if (!(f.reg >> f.bit & 1u)) return f.name;
  if (!__get_cpuid(0x80000001u, &a, &b, &c, &d) || !(c >> 5 & 1u)) return "LZCNT";
  return nullptr;
}

__attribute__((constructor(101))) void check_cpu_baseline() {
  const char* missing = missing_x86_64_v3_feature();
  if (!missing) return;
  std::fprintf(stderr,
               "headroom: this build is for x86-64-v3 CPUs (AVX2, FMA, BMI2, F16C, LZCNT, MOVBE), and here %s is "
               "missing; rebuild with -DHR_CPU_BASELINE=x86-64 for a build that runs on any x86-64 CPU\n",
               missing);
  std::_Exit(1);
}

}  // namespace
#endif
