// The order hdk's selections use, shared by the top-k backends and the router's backends (the
// float64 references derive it on their own): fp32 values mapped to uint32 keys whose unsigned
// order is the numeric order, with -0 equal to +0 and every NaN below -inf; a 64-bit composite
// adds the column so that, among equal keys, the lower column ranks higher and no two entries
// of a row compare equal.
#pragma once

#include <cstdint>

#include "core/float_bits.h"
#include "core/host_device.h"

namespace hdk {
namespace detail {

// 0 for NaN; otherwise the sign-magnitude bits turned into an unsigned order (negative values
// flipped, positive values above them). -inf maps to 0x007fffff, so NaN (0) stays below it.
HDK_HOST_DEVICE uint32_t ordered_key(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0u;
  if (bits == 0x80000000u) bits = 0u;  // -0 ranks as +0, so the two tie by column
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Larger composite = ranks first: key, then the lower column.
HDK_HOST_DEVICE uint64_t ranked_entry(uint32_t key, uint32_t column) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(0xffffffffu - column);
}

HDK_HOST_DEVICE uint32_t column_of(uint64_t entry) {
  return 0xffffffffu - static_cast<uint32_t>(entry & 0xffffffffu);
}

}  // namespace detail
}  // namespace hdk
