# Sourced by scripts/gpu-bundle.sh and the bundle test: the shared libraries a GPU machine is expected to have,
# so the bundle does not carry them (the CUDA driver and toolkit, the C and C++ runtime).
hr_provided_library() {
  case $(basename "$1") in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libutil.so* | \
      libresolv.so* | libstdc++.so* | libgcc_s.so*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libcudnn*.so* | libnvrtc* | \
      libnvJitLink* | libcupti*) return 0 ;;
  esac
  return 1
}
