# CUDA sources of libhdk (included from src/CMakeLists.txt when the CUDA backend is on).
list(APPEND HDK_CUDA_SOURCES
  core/cuda/index_view_to_host.cu
  gdn/cuda/decode_cuda.cu
  gdn/cuda/decode_vk_general_float.cu
  gdn/cuda/decode_vk_general_bf16.cu
  gdn/cuda/decode_vk_short_float.cu
  gdn/cuda/decode_vk_short_bf16.cu
  gdn/cuda/decode_vk_one_token_sweep_float.cu
  gdn/cuda/decode_vk_one_token_sweep_bf16.cu
  gdn/cuda/decode_kv_float.cu
  gdn/cuda/decode_kv_bf16.cu)
