// The CUDA backend of hdk::topk (compiled only with HDK_WITH_CUDA).
#pragma once

#include "hdk/cuda_stream.h"
#include "topk/topk_problem.h"

namespace hdk {
namespace detail {

// One launch on `stream`: a cluster of CTAs per row runs a radix select over the row's ranked
// entries, then the row's leader CTA sorts the k winners. No allocation, no synchronization.
void topk_cuda(const TopkProblem& problem, int device, CudaStream stream);

}  // namespace detail
}  // namespace hdk
