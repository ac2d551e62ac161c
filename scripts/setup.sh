#!/usr/bin/env bash
# Installs the Debian packages Tessera builds with (only those missing), then configures and builds
# into build/ (TESSERA_BUILD_DIR). Two modes:
#   scripts/setup.sh run   what `tessera run` needs: the binary, core, plugins, the CPU backend, and a
#                          GPU backend only where its toolkit and a device are present (scripts/run.sh)
#   scripts/setup.sh all   everything: tests, benchmarks, CUDA/HIP backends where their compilers are
#                          (scripts/test.sh and CI; the default)
# TESSERA_CMAKE_ARGS adds configure arguments after these (e.g. -DTESSERA_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case "$mode" in run | all) ;; *) echo "usage: scripts/setup.sh [run|all]" >&2; exit 2 ;; esac

# Build tools and the libraries the core, plugins and CLI link. ocl-icd-opencl-dev: oneDNN's CMake
# package requires OpenCL's headers and library, which libdnnl-dev only recommends. Open MPI: the
# mpi communicator plugin and `mpirun` for tensor-parallel runs.
packages=(build-essential cmake ninja-build pkg-config ccache
          libyaml-cpp-dev libboost-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libpcre2-dev
          libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin)
if [ "$mode" = all ]; then
  # Tests and benchmarks; the HIP toolkit (CI compiles the HIP backend); the oracles tests call
  # (/usr/bin/python3 with Jinja2, NumPy and jsonschema, which validates structured output);
  # chromium renders the bench report's HTML in a test.
  packages+=(libgtest-dev libgmock-dev libbenchmark-dev hipcc libamdhip64-dev
             python3 python3-jinja2 python3-numpy python3-jsonschema chromium)
  # The sanitizer and fuzz builds (scripts/sanitize.sh, scripts/fuzz.sh): clang with its sanitizer
  # runtimes and libFuzzer (libclang-rt-14-dev), and its OpenMP runtime with Archer (libomp-14-dev).
  packages+=(clang-14 libclang-rt-14-dev libomp-14-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

nvcc_found() { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }
hipcc_found() { command -v hipcc >/dev/null || [ -x /opt/rocm/bin/hipcc ]; }
cuda=OFF hip=OFF
if [ "$mode" = run ]; then
  # A GPU backend is worth its minutes of compiling only where a device can run it.
  if nvcc_found && { [ -e /dev/nvidia0 ] || nvidia-smi -L >/dev/null 2>&1; }; then cuda=ON; fi
  if hipcc_found && [ -e /dev/kfd ]; then hip=ON; fi
  config=(-DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCHMARKS=OFF)
else
  if nvcc_found; then cuda=ON; fi
  if hipcc_found; then hip=ON; fi
  config=(-DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_BENCHMARKS=ON)
fi
config+=(-DTESSERA_CUDA=$cuda -DTESSERA_HIP=$hip)

# Checkouts of the tree in other directories share compiled objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
build_dir=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" "${config[@]}" \
  ${TESSERA_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
