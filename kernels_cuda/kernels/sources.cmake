# Device sources shared by the CUDA and HIP backends (included by both CMakeLists, so a new kernel
# file is listed once). Paths are absolute because the two libraries build in different directories.
set(TESSERA_GPU_DIR ${CMAKE_CURRENT_LIST_DIR}/..)
cmake_path(NORMAL_PATH TESSERA_GPU_DIR)
set(TESSERA_GPU_KERNEL_SOURCES
  ${TESSERA_GPU_DIR}/kernels/add_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/silu_mul_gpu.cu)
set(TESSERA_GPU_KERNEL_HEADERS
  ${TESSERA_GPU_DIR}/vendor.h
  ${TESSERA_GPU_DIR}/kernels_gpu.h
  ${TESSERA_GPU_DIR}/kernels/elementwise.cuh)
