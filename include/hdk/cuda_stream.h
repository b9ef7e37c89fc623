// A CUDA stream handle without pulling the CUDA headers into users' translation units.
#pragma once

// Same forward declaration the CUDA runtime uses: cudaStream_t is `CUstream_st*`, so a
// cudaStream_t (or a torch stream's `.stream()`) converts to hdk::CudaStream implicitly.
struct CUstream_st;

namespace hdk {

using CudaStream = CUstream_st*;

}  // namespace hdk
