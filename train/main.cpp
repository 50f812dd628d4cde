// headroom command line: entry point and sub-command dispatch.
#include <cstdio>
#include <cstring>
#include <string>

#include "core/check.h"

int main(int argc, char** argv) {
  std::printf("headroom\n");
  return 0;
}
