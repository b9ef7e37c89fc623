// The CPU backend of the DeepSeek-V4 router: fp32 math, threads over experts for the gate GEMM
// and over rows for the epilogue.
#pragma once

#include "dsv4/router/router_problem.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Hash-routing indices must have been checked (check_hash_indices) before this runs.
void route_cpu(const RouterProblem& problem);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
