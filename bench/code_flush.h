// The instruction-cache flush of the benchmarks' cold timing (hdk-bench --flush-code, and
// bench/dsv4_vs_peers.py --flush-code through the shared library hdk_bench_code_flush).
#pragma once

#include <cuda_runtime.h>

namespace hdk {
namespace bench {

// 192 KB of straight-line code run by four CTAs a multiprocessor of the current device: what the
// SMs' instruction caches held is evicted, as a kernel inside a decode step finds them.
void launch_code_flush(cudaStream_t stream);

}  // namespace bench
}  // namespace hdk

// The same for Python (ctypes) benchmarks: `stream` is a cudaStream_t; returns the launch's
// cudaError_t (0 on success).
extern "C" int hdk_bench_code_flush(void* stream);
