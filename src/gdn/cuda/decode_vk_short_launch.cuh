// Launcher of the short kernel; decode_vk_short_{bf16,float}.cu instantiate it once per state
// dtype. It takes the shapes of built_kernels.h, as the general kernel's launcher
// (decode_vk_general_launch.cuh) does, so a sweep can compare the two kernels shape by shape; each
// shape for q/k/v in bf16, fp16 and fp32, with 32- or 64-bit token offsets, with or without
// per-token slots.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "gdn/common_decode_problem.h"
#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_kernel_vk_short.cuh"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/decode_vk_short_registers.h"
#include "gdn/cuda/dispatch.h"
#include "gdn/short_kernel_fit.h"
#include "hdk/dtype.h"
#include "hdk/error.h"

namespace hdk {
namespace gdn {
namespace detail {

template <typename StateT, int K, int kRows, int kLanes>
void launch_vk_short_shape(const DecodeProblem& problem, const ShortLaunch& plan,
                           cudaStream_t stream) {
  using Shape = VKShape<StateT, K, kRows, kLanes>;
  const int warps_per_cta = plan.warps_per_cta;
  const int64_t tiles_per_head = plan.tiles_per_head;
  check_row_coverage(problem, 1, Shape::kRowsPerWarp, tiles_per_head);
  if (warps_per_cta < 1 || warps_per_cta > kVKWarpsPerCta) {
    throw Error("hdk::gdn::decode: internal launch plan error: the short kernel takes 1 to " +
                std::to_string(kVKWarpsPerCta) + " warps per CTA, not " +
                std::to_string(warps_per_cta));
  }
  // Grid (CTA of the head's row tiles, value head, request): plan_launch sends calls beyond its
  // limits to the general kernel; a plan that did not must fail here, not wrap around.
  if (problem.num_requests > kMaxGridYZ || problem.num_v_heads > kMaxGridYZ ||
      tiles_per_head > kMaxGridX) {
    throw Error(
        "hdk::gdn::decode: internal launch plan error: " + std::to_string(problem.num_requests) +
        " requests x " + std::to_string(problem.num_v_heads) + " heads x " +
        std::to_string(tiles_per_head) + " row tiles exceed the short kernel's grid");
  }
  const dim3 grid(static_cast<unsigned>((tiles_per_head + warps_per_cta - 1) / warps_per_cta),
                  static_cast<unsigned>(problem.num_v_heads),
                  static_cast<unsigned>(problem.num_requests));
  const dim3 block(warps_per_cta * 32);
  auto launch = [&](auto input, auto narrow, auto token_slots, auto one_token) {
    using InputT = typename decltype(input)::type;
    constexpr bool kNarrow = decltype(narrow)::value;
    constexpr bool kSlots = decltype(token_slots)::value;
    constexpr bool kOneToken = decltype(one_token)::value;
    constexpr int kRegisters =
        short_kernel_registers<StateT, InputT, K, kRows, kLanes, kNarrow, kSlots, kOneToken>();
    const int tiles = static_cast<int>(tiles_per_head);
    if (plan.common_form) {
      // The common form's instances: 32-bit token offsets and no per-token slots by its
      // definition, the shapes of common_form_built.
      constexpr bool kBuilt = kNarrow && !kSlots &&
                              common_form_built(sizeof(StateT), K, kLanes, kRows,
                                                std::is_same_v<InputT, __nv_bfloat16>);
      if constexpr (kBuilt) {
        constexpr int kCommonRegisters = short_common_form_register_cap(sizeof(StateT), kOneToken);
        auto launch_common = [&](auto state_first) {
          constexpr bool kStateFirst = decltype(state_first)::value;
          if (problem.variable_length) {
            gdn_decode_vk_short_kernel<CommonDecodeStepProblem, StateT, InputT, K, kRows, kLanes,
                                       kNarrow, kSlots, kOneToken, kStateFirst, kCommonRegisters>
                <<<grid, block, 0, stream>>>(tiles, to_common_decode_step(problem));
          } else {
            gdn_decode_vk_short_kernel<CommonDecodeProblem, StateT, InputT, K, kRows, kLanes,
                                       kNarrow, kSlots, kOneToken, kStateFirst, kCommonRegisters>
                <<<grid, block, 0, stream>>>(tiles, to_common_form(problem));
          }
        };
        if (!plan.state_first) {
          launch_common(std::false_type());
        } else if constexpr (short_state_first_built(sizeof(StateT), kOneToken)) {
          launch_common(std::true_type());
        } else {
          throw Error(
              "hdk::gdn::decode: internal launch plan error: the short kernel loads the state "
              "first only in the common form's one-token build with fp32 state");
        }
        return;
      } else {
        throw Error(
            "hdk::gdn::decode: internal launch plan error: no short kernel instance of the "
            "common form for this shape");
      }
    }
    // On the full problem the one-token build exists for bf16 state only (fp32 measured no
    // faster with it there).
    if constexpr (sizeof(StateT) == 2 || !kOneToken) {
      if (plan.state_first) {
        throw Error(
            "hdk::gdn::decode: internal launch plan error: the short kernel loads the state first "
            "only in the common form");
      }
      gdn_decode_vk_short_kernel<DecodeProblem, StateT, InputT, K, kRows, kLanes, kNarrow, kSlots,
                                 kOneToken, false, kRegisters>
          <<<grid, block, 0, stream>>>(tiles, problem);
    } else {
      throw Error(
          "hdk::gdn::decode: internal launch plan error: the short kernel's one-token build "
          "with fp32 state is built for the common form only");
    }
  };
  auto with_one_token = [&](auto input, auto narrow, auto token_slots) {
    if (plan.one_token) return launch(input, narrow, token_slots, std::true_type());
    return launch(input, narrow, token_slots, std::false_type());
  };
  auto with_flags = [&](auto input) {
    const bool slots = writes_token_slots(problem);
    if (plan.narrow_offsets) {
      if (slots) return with_one_token(input, std::true_type(), std::true_type());
      return with_one_token(input, std::true_type(), std::false_type());
    }
    if (slots) return with_one_token(input, std::false_type(), std::true_type());
    return with_one_token(input, std::false_type(), std::false_type());
  };
  switch (problem.q.dtype) {
    case DType::kBFloat16:
      return with_flags(std::common_type<__nv_bfloat16>());
    case DType::kFloat16:
      return with_flags(std::common_type<__half>());
    default:
      return with_flags(std::common_type<float>());
  }
}

// The short kernel, at the shapes built_kernels.h lists (those of launch_decode_vk_general).
// The caller has checked that no request has more than kShortMaxTokens tokens (or one, for the
// one-token build).
template <typename StateT>
void launch_decode_vk_short(const DecodeProblem& problem, const ShortLaunch& plan,
                            cudaStream_t stream) {
  HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
    auto launch = [&](auto rows, auto lanes) {
      constexpr int kRows = decltype(rows)::value, kLanes = decltype(lanes)::value;
      launch_vk_short_shape<StateT, kHeadK, kRows, kLanes>(problem, plan, stream);
    };
    if (!launch_built_vk_shape<sizeof(StateT), kHeadK>(plan.lanes_per_row, plan.rows_per_thread,
                                                       launch)) {
      no_kernel_for("short", kHeadK, plan.lanes_per_row, plan.rows_per_thread);
    }
  });
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
