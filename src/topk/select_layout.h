// The shared-memory layout of hdk::topk's cluster radix select (cuda/cluster_select.cuh), as plain
// host-and-device code so that host planning (and its CPU tests) can size a kernel's shared memory
// without CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/host_device.h"

namespace hdk {
namespace detail {

constexpr int kSelectDigitBits = 11;
constexpr int kSelectBins = 1 << kSelectDigitBits;
constexpr int kSelectCandidates = 4096;  // the leader's buffer for the entries of the chosen bin

// The select's sort capacity for the `k` largest of a row of up to `length` entries: the power of
// two that holds the most winners a row can have.
HDK_HOST_DEVICE int select_sort_capacity(int64_t k, int64_t length) {
  const int64_t most = k < length ? k : (length > 1 ? length : 1);
  int capacity = 1;
  while (capacity < most)
    capacity <<= 1;
  return capacity;
}

// Byte offsets of the selection's shared memory (from the start of the dynamic shared memory,
// which must be 16-byte aligned); `bytes` is where the caller's own data may start. Offsets are
// multiples of 16 given the 32-byte control block.
struct SelectLayout {
  size_t sorted, candidate, histogram, totals, warp_sums, bytes;
};

HDK_HOST_DEVICE SelectLayout select_layout(int sort_capacity) {
  SelectLayout layout;
  layout.sorted = 32;
  layout.candidate = layout.sorted + static_cast<size_t>(sort_capacity) * 8;
  layout.histogram = layout.candidate + static_cast<size_t>(kSelectCandidates) * 8;
  layout.totals = layout.histogram + 2 * kSelectBins * 4;
  layout.warp_sums = layout.totals + kSelectBins * 4;
  layout.bytes = layout.warp_sums + 32 * 4;
  return layout;
}

}  // namespace detail
}  // namespace hdk
