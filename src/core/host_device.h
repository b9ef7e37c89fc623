// Lets small helpers compile both into the C++ library and into CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define HDK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HDK_HOST_DEVICE inline
#endif
