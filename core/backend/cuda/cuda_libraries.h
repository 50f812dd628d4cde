// cuBLAS, cuBLASLt and NVRTC are opened when the CUDA back-end first needs them, not when a program starts. Linked
// the usual way, libcublasLt's initializers ran in every process of a CUDA build: 0.13-0.16 s and 240 MiB of
// resident memory before main on a Zen 3, in a CPU training run, `headroom plan`, every test. cuda_libraries.cpp
// defines the functions the back-end (and cuDNN's frontend, for NVRTC) calls, each forwarding to the library's own
// on first use; the CUDA back-end's start opens NVRTC before cuDNN's handle, since cuDNN's runtime-compiled
// engines load it by name themselves. The CUDA runtime and cuDNN (itself a small loader) stay linked.
#pragma once

#include <string>

namespace hr::cuda {

enum class Library { Cublas, CublasLt, Nvrtc };
inline constexpr Library kLibraries[] = {Library::Cublas, Library::CublasLt, Library::Nvrtc};

// "cuBLAS", "cuBLASLt", "NVRTC".
const char* library_name(Library lib);

// The library's file name, as dlopen is given it: libcublas.so.13 for the toolkit this was built against.
std::string library_file(Library lib);

// The library's handle, opened on first use; throws hr::Error naming the file, what needs it and dlerror's
// reason when it cannot be opened.
void* library(Library lib);

// Opens `file` (dlopen, RTLD_NOW | RTLD_LOCAL) or throws as library() does, `what` naming what it is for.
void* open_library(const std::string& file, const char* what);

// Where the library was found (opening it), or why it cannot be opened: for `headroom info`.
struct Found {
  bool ok = false;
  std::string text;  // the path it was loaded from, or the error
};
Found library_found(Library lib);

// `name` in the library, or throws hr::Error naming both.
void* library_symbol(Library lib, const char* name);

}  // namespace hr::cuda
