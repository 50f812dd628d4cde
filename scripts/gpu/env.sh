# Sourced in a GPU bundle (scripts/gpu-bundle.sh): its programs find their libraries in lib/, the CUDA libraries
# in the toolkit or in the pip nvidia-* packages of the python3 that holds PyTorch, Open MPI its plugins.
hr_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hr_cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && hr_cuda_dirs="$hr_cuda_dirs:$d"
done
if command -v python3 > /dev/null; then
  hr_cuda_dirs="$hr_cuda_dirs$(python3 - 2> /dev/null << 'PY'
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(s, "nvidia", "**", "lib"), recursive=True))
print("".join(":" + d for d in dirs), end="")
PY
)"
fi
export LD_LIBRARY_PATH="$hr_bundle/lib$hr_cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$hr_bundle/bin:$PATH"
export OMPI_MCA_mca_base_component_path="$hr_bundle/lib/openmpi3"
export OPAL_PKGDATADIR="$hr_bundle/share-openmpi"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
