# Device sources shared by the CUDA and HIP backends (included by both CMakeLists, so a new kernel
# file is listed once). Paths are absolute because the two libraries build in different directories.
set(TESSERA_GPU_DIR ${CMAKE_CURRENT_LIST_DIR}/..)
cmake_path(NORMAL_PATH TESSERA_GPU_DIR)
set(TESSERA_GPU_KERNEL_SOURCES
  ${TESSERA_GPU_DIR}/kernels/add_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/silu_mul_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/gelu_mul_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/add_rows_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/scale_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/rms_norm_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/rope_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/softmax_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/argmax_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/embedding_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/kv_write_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/attention_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/attention_dense_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/attention_block_scores_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/gemm_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/gemm_i8_gpu.cu
  ${TESSERA_GPU_DIR}/kernels/convert_gpu.cu)
set(TESSERA_GPU_KERNEL_HEADERS
  ${TESSERA_GPU_DIR}/vendor.h
  ${TESSERA_GPU_DIR}/kernels_gpu.h
  ${TESSERA_GPU_DIR}/kernels/common.cuh
  ${TESSERA_GPU_DIR}/kernels/gguf_blocks.cuh
  ${TESSERA_GPU_DIR}/kernels/elementwise.cuh)
