// Register caps of the short kernel's instances (decode_kernel_vk_short.cuh), one per
// build: the lowest multiple of 8 (from 72) with which ptxas (CUDA 13.0, sm_90a) spilled
// nothing, found by compiling every instance at each cap before the kernel's 3-D grid and
// 16-byte final stores; with those, eight caps were raised by 8 where a few bytes spilled, and
// some of the others may now be higher than needed (docs/gdn-cuda-dispatch.md has the table with
// the registers used). A cap only decides how many warps share an SM; it must never force a
// spill inside the token loop, which measured slower than the lost warps (the general kernel at
// 80 and 96). Shapes whose lanes hold more than 32 state values (bf16 K = 128 with 8 rows per
// thread or 8 lanes per row and 4 rows) are not listed: uncapped, they need 128-200.
// The one-token build (no token loop; bf16 state only, 0 for fp32 state where it is not built)
// has caps of its own, the lowest multiple of 8 from 56 with which it spilled nothing.
// The non-finite input check (decode_kernel_vk_short.cuh) made many instances spill at these
// caps; those that spilled more than 16 bytes went up by 8, the others keep their cap and spill
// a few bytes: on the bf16 common-form token loop an 8-byte spill at 80 measured faster than no
// spill at 88 (H200, qwen3-next B = 16: T = 2 21.5 against 22.4 us; bench/results/gdn-h200).
// Another compiler version may need other caps: recheck with -Xptxas -warn-spills.
#pragma once

namespace hdk {
namespace gdn {
namespace detail {

enum class ShortInput { kBf16, kFp16, kFp32 };  // dtype of q, k and v

struct ShortRegisterCap {
  int state_bytes;
  ShortInput input;
  int head_k, rows_per_thread, lanes_per_row;
  // 32-bit token offsets without / with per-token slots, then 64-bit without / with; for the
  // token-loop build, then for the one-token build.
  int caps[4];
  int one_token_caps[4];
};

inline constexpr ShortRegisterCap kShortRegisterCaps[] = {
    {2, ShortInput::kBf16, 64, 4, 8, {80, 96, 96, 104}, {64, 64, 72, 64}},
    {2, ShortInput::kBf16, 128, 2, 16, {72, 72, 72, 72}, {56, 56, 56, 56}},
    {2, ShortInput::kBf16, 128, 4, 16, {80, 96, 96, 104}, {64, 64, 64, 64}},
    {2, ShortInput::kBf16, 128, 2, 8, {96, 104, 104, 112}, {72, 72, 72, 64}},
    {2, ShortInput::kBf16, 256, 4, 32, {96, 96, 96, 104}, {72, 72, 72, 72}},
    {2, ShortInput::kFp16, 64, 4, 8, {96, 96, 104, 104}, {64, 64, 72, 64}},
    {2, ShortInput::kFp16, 128, 2, 16, {72, 72, 72, 72}, {56, 56, 56, 56}},
    {2, ShortInput::kFp16, 128, 4, 16, {96, 96, 104, 104}, {64, 64, 64, 64}},
    {2, ShortInput::kFp16, 128, 2, 8, {104, 104, 104, 112}, {72, 72, 72, 64}},
    {2, ShortInput::kFp16, 256, 4, 32, {96, 96, 104, 112}, {72, 72, 72, 72}},
    {2, ShortInput::kFp32, 64, 4, 8, {96, 104, 104, 112}, {72, 72, 64, 72}},
    {2, ShortInput::kFp32, 128, 2, 16, {80, 88, 88, 88}, {64, 64, 64, 64}},
    {2, ShortInput::kFp32, 128, 4, 16, {96, 104, 104, 112}, {72, 72, 72, 72}},
    {2, ShortInput::kFp32, 128, 2, 8, {120, 128, 128, 160}, {88, 88, 88, 88}},
    {2, ShortInput::kFp32, 256, 4, 32, {104, 104, 104, 112}, {80, 72, 72, 72}},
    {4, ShortInput::kBf16, 64, 8, 16, {88, 96, 96, 96}, {0, 0, 0, 0}},
    {4, ShortInput::kBf16, 128, 2, 32, {72, 72, 72, 72}, {0, 0, 0, 0}},
    {4, ShortInput::kBf16, 128, 4, 32, {72, 72, 72, 72}, {0, 0, 0, 0}},
    {4, ShortInput::kBf16, 128, 8, 32, {96, 96, 96, 104}, {0, 0, 0, 0}},
    {4, ShortInput::kBf16, 128, 2, 16, {72, 72, 80, 88}, {0, 0, 0, 0}},
    {4, ShortInput::kBf16, 128, 4, 16, {88, 96, 104, 104}, {0, 0, 0, 0}},
    {4, ShortInput::kBf16, 256, 4, 32, {96, 104, 96, 104}, {0, 0, 0, 0}},
    {4, ShortInput::kFp16, 64, 8, 16, {88, 96, 96, 96}, {0, 0, 0, 0}},
    {4, ShortInput::kFp16, 128, 2, 32, {72, 72, 72, 72}, {0, 0, 0, 0}},
    {4, ShortInput::kFp16, 128, 4, 32, {72, 72, 72, 72}, {0, 0, 0, 0}},
    {4, ShortInput::kFp16, 128, 8, 32, {88, 96, 96, 96}, {0, 0, 0, 0}},
    {4, ShortInput::kFp16, 128, 2, 16, {72, 72, 80, 80}, {0, 0, 0, 0}},
    {4, ShortInput::kFp16, 128, 4, 16, {88, 88, 104, 104}, {0, 0, 0, 0}},
    {4, ShortInput::kFp16, 256, 4, 32, {88, 104, 96, 104}, {0, 0, 0, 0}},
    {4, ShortInput::kFp32, 64, 8, 16, {96, 104, 104, 104}, {0, 0, 0, 0}},
    {4, ShortInput::kFp32, 128, 2, 32, {72, 72, 72, 72}, {0, 0, 0, 0}},
    {4, ShortInput::kFp32, 128, 4, 32, {72, 72, 80, 80}, {0, 0, 0, 0}},
    {4, ShortInput::kFp32, 128, 8, 32, {96, 104, 104, 104}, {0, 0, 0, 0}},
    {4, ShortInput::kFp32, 128, 2, 16, {80, 80, 88, 88}, {0, 0, 0, 0}},
    {4, ShortInput::kFp32, 128, 4, 16, {96, 96, 104, 112}, {0, 0, 0, 0}},
    {4, ShortInput::kFp32, 256, 4, 32, {96, 96, 104, 112}, {0, 0, 0, 0}},
};

// The instances of the common form (CommonDecodeProblem: 32-bit token offsets, no per-token
// slots, the shapes of common_form_built, bf16 q/k/v, heads of whole warp tiles), found the same
// way: bf16 state 80 (token loop) and 72 (one-token build: at 64 it spilled, and measured 2-5%
// slower from B = 4); fp32 state 80 (token loop, 79 used) and 64 (one-token build), which fit
// once the state's loads and stores took one address and immediate offsets (with an address
// per row they spilled 24 bytes at 64 and needed 96 for the token loop).
constexpr int short_common_form_register_cap(int state_bytes, bool one_token) {
  if (state_bytes == 2) return one_token ? 72 : 80;
  return one_token ? 64 : 80;
}

// The cap of one instance; 255 (no cap) for a shape not in the table.
constexpr int short_register_cap(int state_bytes, ShortInput input, int head_k, int rows_per_thread,
                                 int lanes_per_row, bool narrow_offsets, bool token_slots,
                                 bool one_token) {
  for (const ShortRegisterCap& entry : kShortRegisterCaps) {
    if (entry.state_bytes == state_bytes && entry.input == input && entry.head_k == head_k &&
        entry.rows_per_thread == rows_per_thread && entry.lanes_per_row == lanes_per_row) {
      const int column = (narrow_offsets ? 0 : 2) + (token_slots ? 1 : 0);
      return one_token ? entry.one_token_caps[column] : entry.caps[column];
    }
  }
  return 255;
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
