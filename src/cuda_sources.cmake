# CUDA sources of libhdk (included from src/CMakeLists.txt when the CUDA backend is on).
list(APPEND HDK_CUDA_SOURCES
  core/cuda/index_view_to_host.cu
  gdn/cuda/decode_cuda.cu
  gdn/cuda/decode_vk_float.cu
  gdn/cuda/decode_vk_bf16.cu
  gdn/cuda/decode_vk_lean_float.cu
  gdn/cuda/decode_vk_lean_bf16.cu
  gdn/cuda/decode_vk_single_float.cu
  gdn/cuda/decode_vk_single_bf16.cu
  gdn/cuda/decode_kv_float.cu
  gdn/cuda/decode_kv_bf16.cu)
