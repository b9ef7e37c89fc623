// The CPU backend of hdk::topk: threads over rows, a linear-time selection per row.
#pragma once

#include "topk/topk_problem.h"

namespace hdk {
namespace detail {

void topk_cpu(const TopkProblem& problem);

}  // namespace detail
}  // namespace hdk
