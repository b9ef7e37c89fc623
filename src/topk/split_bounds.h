// How the radix select's pass over a row (topk/cuda/cluster_select.cuh and cta_select.cuh) judges
// each entry once the prefix is chosen: an entry above the prefix wins, one in it wins when the
// select is done and is a candidate when not. Host-and-device code so that the CPU tests check it
// against the comparison of whole 64-bit entries (tests/topk/split_bounds_test.cpp).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "topk/topk_key.h"

namespace hdk {
namespace detail {

// The entry's top `bits` bits (1 .. 64).
HDK_HOST_DEVICE uint64_t top_bits(uint64_t entry, int bits) {
  return entry >> (64 - bits);
}

struct SplitVerdict {
  bool win, maybe;
};

// While the prefix lies within the 32-bit key, the keys in it are [at_min, at_max], so a key takes
// two comparisons with bounds made once: index_topk's one-CTA select spent 31 instructions a key
// shifting each 64-bit entry to its prefix and comparing it (ncu, H200). A prefix that reaches
// into the columns (keys that tie through 32 bits: `wide`) compares whole entries. With every
// entry selected (select_all: no prefix, done) every key wins.
class SplitBounds {
 public:
  HDK_HOST_DEVICE SplitBounds(uint64_t prefix, int prefix_bits, bool done, bool select_all)
      : prefix_(prefix), prefix_bits_(prefix_bits), done_(done), wide_(prefix_bits > 32) {
    uint32_t at_min = 0, at_max = 0xffffffffu;
    if (!select_all && !wide_) {
      const int shift = 32 - prefix_bits;  // 0 .. 21: the first level has chosen 11 bits
      at_min = static_cast<uint32_t>(prefix) << shift;
      at_max = at_min | ((1u << shift) - 1u);
    }
    at_min_ = at_min;
    every_key_wins_ = done && at_min == 0u;  // where at_min - 1 would wrap
    win_above_ = done ? at_min - 1u : at_max;
  }
  HDK_HOST_DEVICE bool wide() const { return wide_; }
  // A key's verdict where the prefix is not wide.
  HDK_HOST_DEVICE SplitVerdict of_key(uint32_t key) const {
    const bool win = every_key_wins_ || key > win_above_;
    return SplitVerdict{win, !done_ && !win && key >= at_min_};
  }
  // An entry's verdict where it is.
  HDK_HOST_DEVICE SplitVerdict of_entry(uint64_t entry) const {
    const uint64_t top = top_bits(entry, prefix_bits_);
    return SplitVerdict{top > prefix_ || (done_ && top == prefix_), !done_ && top == prefix_};
  }
  HDK_HOST_DEVICE SplitVerdict of(uint32_t key, uint32_t column) const {
    return wide_ ? of_entry(ranked_entry(key, column)) : of_key(key);
  }

 private:
  uint64_t prefix_;
  int prefix_bits_;
  bool done_, wide_, every_key_wins_;
  uint32_t at_min_, win_above_;
};

}  // namespace detail
}  // namespace hdk
