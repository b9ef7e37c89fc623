// The GDN decode kernels that are built: one constexpr table the launchers instantiate from and
// the dispatcher checks a launch plan against. Host code only (CPU-tested).
//
// The dispatcher's own choices need few shapes: each (state dtype, K) runs the short and general
// kernels at its full lanes per row and default rows per thread. The other K = 128 shapes and the
// one-token sweep kernel serve tuning sweeps only (hdk-bench's --rows-per-thread,
// --lanes-per-row, --one-token-sweep-kernel): they are built with -DHDK_GDN_SWEEP_KERNELS=ON and
// compiling them roughly doubles the GDN CUDA sources' build time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "gdn/cuda/decode_launch.h"
#include "hdk/error.h"

#ifndef HDK_GDN_SWEEP_KERNELS
#define HDK_GDN_SWEEP_KERNELS 0
#endif

namespace hdk {
namespace gdn {
namespace detail {

// Whether this build has the sweep-only kernels (CMake option HDK_GDN_SWEEP_KERNELS).
inline constexpr bool kSweepKernelsBuilt = HDK_GDN_SWEEP_KERNELS != 0;

// One shape of the short and general kernels: lanes sharing a state row, rows each thread holds.
struct VKShapeEntry {
  int state_bytes;
  int head_k;
  int lanes_per_row;
  int rows_per_thread;
  bool sweep_only;
};

constexpr VKShapeEntry default_vk_shape(int state_bytes, int head_k) {
  return {state_bytes, head_k, full_lanes_per_row(state_bytes, head_k),
          vk_default_rows(state_bytes, head_k), false};
}

// Every shape with an instance, the dispatcher's first. K = 128 also has the shapes the
// sweeps compare (docs/gdn-cuda-dispatch.md): half or full lanes, 2, 4 or 8 rows, each
// distinct from the default (bf16: 16 lanes x 4 rows; fp32: 32 lanes x 8 rows).
inline constexpr VKShapeEntry kVKShapes[] = {
    default_vk_shape(2, 64), default_vk_shape(2, 128), default_vk_shape(2, 256),
    default_vk_shape(4, 64), default_vk_shape(4, 128), default_vk_shape(4, 256),
    {2, 128, 8, 2, true},    {2, 128, 8, 4, true},     {2, 128, 16, 2, true},
    {2, 128, 16, 8, true},   {4, 128, 16, 2, true},    {4, 128, 16, 4, true},
    {4, 128, 32, 2, true},   {4, 128, 32, 4, true},
};
inline constexpr std::size_t kVKShapeCount = sizeof(kVKShapes) / sizeof(kVKShapes[0]);

constexpr bool vk_shape_entry_built(const VKShapeEntry& entry) {
  return !entry.sweep_only || kSweepKernelsBuilt;
}

// The table's entry for a shape, or nullptr.
constexpr const VKShapeEntry* find_vk_shape(int state_bytes, int64_t head_k, int lanes_per_row,
                                            int rows_per_thread) {
  for (const VKShapeEntry& entry : kVKShapes) {
    if (entry.state_bytes == state_bytes && entry.head_k == head_k &&
        entry.lanes_per_row == lanes_per_row && entry.rows_per_thread == rows_per_thread) {
      return &entry;
    }
  }
  return nullptr;
}

// Calls launch(integral_constant<rows>, integral_constant<lanes>) for the built shape of
// (state_bytes, K) with these lanes and rows; false when there is none. Instantiates the launch
// for the table's built shapes of (state_bytes, K) only.
template <int kStateBytes, int kHeadK, typename Launch, std::size_t... kIndex>
bool launch_built_vk_shape(int lanes_per_row, int rows_per_thread, Launch&& launch,
                           std::index_sequence<kIndex...>) {
  bool launched = false;
  auto try_entry = [&](auto index) {
    constexpr VKShapeEntry kEntry = kVKShapes[decltype(index)::value];
    if constexpr (kEntry.state_bytes == kStateBytes && kEntry.head_k == kHeadK &&
                  vk_shape_entry_built(kEntry)) {
      if (!launched && lanes_per_row == kEntry.lanes_per_row &&
          rows_per_thread == kEntry.rows_per_thread) {
        launched = true;
        launch(std::integral_constant<int, kEntry.rows_per_thread>(),
               std::integral_constant<int, kEntry.lanes_per_row>());
      }
    }
  };
  (try_entry(std::integral_constant<std::size_t, kIndex>()), ...);
  return launched;
}

template <int kStateBytes, int kHeadK, typename Launch>
bool launch_built_vk_shape(int lanes_per_row, int rows_per_thread, Launch&& launch) {
  return launch_built_vk_shape<kStateBytes, kHeadK>(lanes_per_row, rows_per_thread, launch,
                                                    std::make_index_sequence<kVKShapeCount>());
}

// Whether the one-token sweep kernel (gdn_decode_vk_one_token_sweep_kernel) is built: the
// dispatcher never picks it (the short kernel's builds are faster at every size,
// docs/gdn-cuda-dispatch.md).
inline constexpr bool kOneTokenSweepKernelBuilt = kSweepKernelsBuilt;

// A launcher's refusal of a plan whose kernel has no instance for its shape (launch_plan_built
// refuses such plans before any launch, so this is an internal error).
[[noreturn]] inline void no_kernel_for(const char* kernel, int64_t head_k, int lanes_per_row,
                                       int rows_per_thread) {
  throw Error(std::string("hdk::gdn::decode: internal launch plan error: no ") + kernel +
              " kernel for K = " + std::to_string(head_k) + " with " +
              std::to_string(lanes_per_row) + " lanes per row and " +
              std::to_string(rows_per_thread) + " rows per thread");
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
