// The builds of the CPU decode's per-task loop (decode_tasks.h): the baseline on 4-float vectors
// and, on x86-64, AVX2/FMA on 8-float and AVX-512 on 16-float vectors (one with AVX512-BF16's
// conversion), picked at run time by decode_cpu.cpp. One binary runs everywhere and uses wide
// vectors where they exist: bf16 rows are bound by their widening and rounding, which AVX-512
// runs in 40% less time than AVX2. Each build is its own translation unit
// (decode_build_*.cpp), so they compile in parallel.
#pragma once

#include <cstdint>

#include "gdn/decode_problem.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HDK_GDN_CPU_X86_BUILDS 1
// Each build's instruction sets, the same on its declaration and its definition.
#define HDK_GDN_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define HDK_GDN_CPU_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define HDK_GDN_CPU_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#endif

namespace hdk {
namespace gdn {
namespace detail {

// Each runs the (request, value head) tasks [begin, end) and returns how many heads it refused
// for a non-finite input.
int64_t run_tasks_baseline(const DecodeProblem& p, int64_t begin, int64_t end);
#ifdef HDK_GDN_CPU_X86_BUILDS
HDK_GDN_CPU_TARGET_AVX2 int64_t run_tasks_avx2(const DecodeProblem& p, int64_t begin, int64_t end);
HDK_GDN_CPU_TARGET_AVX512 int64_t run_tasks_avx512(const DecodeProblem& p, int64_t begin,
                                                   int64_t end);
HDK_GDN_CPU_TARGET_AVX512_BF16 int64_t run_tasks_avx512_bf16(const DecodeProblem& p, int64_t begin,
                                                             int64_t end);
#endif

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
