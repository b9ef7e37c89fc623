# CUDA sources of the DeepSeek-V4 router, KV cache and hdk::topk (included from src/CMakeLists.txt when the
# CUDA backend is on). One translation unit per kernel family so nvcc compiles them in parallel.
list(APPEND HDK_CUDA_SOURCES
  dsv4/router/cuda/router_cuda.cu
  dsv4/router/cuda/router_gate_gemm.cu
  dsv4/router/cuda/router_gate_split.cu
  dsv4/router/cuda/router_gate_gemv.cu
  dsv4/kv_cache/cuda/kv_cache_cuda.cu
  dsv4/index_topk/cuda/index_topk_cuda.cu
  dsv4/index_topk/cuda/query_quantize_cuda.cu
  dsv4/sparse_decode/cuda/sparse_decode_cuda.cu
  dsv4/sparse_decode/cuda/sparse_decode_mma_kernel.cu
  dsv4/sparse_decode/cuda/sparse_decode_pipelined_kernel.cu
  dsv4/sparse_decode/cuda/sparse_decode_combine_kernel.cu
  dsv4/sparse_decode/cuda/sparse_decode_simple_kernel.cu
  topk/cuda/topk_cuda.cu)
