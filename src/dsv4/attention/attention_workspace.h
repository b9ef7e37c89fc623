// The caller's workspace of index_topk and sparse_decode (hdk/dsv4/attention.h): how many bytes a
// call may use and where each part lies. Pure functions of the shapes and the SM count, shared by
// the public size functions, the validation and the CUDA launch plans, and tested on the CPU.
//
// sparse_decode: a row whose list is split over CTAs outside one thread-block cluster leaves each
// CTA's partial result in the workspace, and a combine kernel finishes the row. One record per
// CTA (row, split, head group): its unnormalized O [heads][512] fp32 (or bf16 in the first half
// of that space, SparsePlan::bf16_records), its per-head (max in log2 units, sum) and an invalid
// flag, for the group's 64 heads, or 32 or 16 where the plan takes smaller groups.
//
// index_topk: a row scored by CTAs outside one cluster writes its scores, as the order-preserving
// uint32 keys of topk_key.h, and each CTA its verdict on its share, to the workspace; the select
// then reads them from there.
#pragma once

#include <cstdint>

#include "core/ceil_div.h"
#include "core/host_device.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr int64_t kWorkspaceAlignment = 256;  // bytes; every part starts on this boundary

HDK_HOST_DEVICE constexpr int64_t workspace_round_up(int64_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// ---- sparse_decode ----------------------------------------------------------------------------
// The heads a CTA takes, its head group, and so its workspace record: at most 64, at least 16.
constexpr int kSparseGroupHeads = 64;
constexpr int kSparseFewestGroupHeads = 16;
constexpr int64_t kSparseRecordColumns = 512;  // the entry width
constexpr int kSparseTile = 64;                // entries per step of a CTA's list
// The most list splits a row takes through the workspace: the combine keeps one weight per split
// and head in shared memory.
constexpr int kSparseMaxWorkspaceSplits = 64;
// The most CTAs (head groups x splits) a row takes through the workspace: the combine reads the
// row's flags one a thread, all in its first round of loads.
constexpr int kSparseMaxWorkspaceRowCtas = 256;

// Head groups of `group_heads` heads (64 unless given) for Hq heads, and tiles of a list: shared
// by the workspace's size and sparse_decode's plan (sparse_decode_plan.h).
HDK_HOST_DEVICE int sparse_head_groups(int64_t heads, int group_heads = kSparseGroupHeads) {
  return static_cast<int>(hdk::detail::ceil_div(heads, int64_t{group_heads}));
}
HDK_HOST_DEVICE int64_t sparse_tiles(int64_t list_length) {
  return hdk::detail::ceil_div(list_length, kSparseTile);
}

// Splits through the workspace fill the GPU once: at most as many CTAs as SMs (and
// kSparseMaxWorkspaceRowCtas a row), at least one tile each, at most kSparseMaxWorkspaceSplits;
// 1 (no workspace split) where the rows' head groups fill the SMs already.
HDK_HOST_DEVICE int sparse_workspace_max_splits(int64_t rows, int groups, int64_t tiles,
                                                int sm_count) {
  if (rows <= 0 || groups <= 0 || tiles <= 1) return 1;
  int64_t most = sm_count / (rows * groups);
  if (most > kSparseMaxWorkspaceRowCtas / groups) most = kSparseMaxWorkspaceRowCtas / groups;
  if (most > tiles) most = tiles;
  if (most > kSparseMaxWorkspaceSplits) most = kSparseMaxWorkspaceSplits;
  return most > 1 ? static_cast<int>(most) : 1;
}

struct SparseWorkspaceLayout {
  int64_t records = 0;       // rows x splits x groups
  int64_t o_offset = 0;      // records x [heads][512] fp32 (or bf16, in the first half)
  int64_t stats_offset = 0;  // records x [2][heads] fp32: maxima (log2 units), then sums
  int64_t flags_offset = 0;  // records x int32: the CTA's invalid flag
  int64_t bytes = 0;
};

// The layout for head groups of `heads` heads each.
HDK_HOST_DEVICE SparseWorkspaceLayout sparse_workspace_layout(int64_t rows, int groups, int splits,
                                                              int heads = kSparseGroupHeads) {
  SparseWorkspaceLayout layout;
  layout.records = rows * groups * splits;
  layout.o_offset = 0;
  layout.stats_offset = workspace_round_up(layout.records * heads * kSparseRecordColumns * 4);
  layout.flags_offset = layout.stats_offset + workspace_round_up(layout.records * 2 * heads * 4);
  layout.bytes = layout.flags_offset + workspace_round_up(layout.records * 4);
  return layout;
}

// Record of CTA (row, split, group) of a row split `splits` ways.
HDK_HOST_DEVICE constexpr int64_t sparse_record(int64_t row, int split, int group, int splits,
                                                int groups) {
  return (row * splits + split) * groups + group;
}

// The bytes sparse_decode may use for `rows` query rows of `heads` heads over lists of
// `list_length` entries (both lists together) on a device of `sm_count` SMs: 0 where it never
// splits through the workspace. A plan splits a row at most as many ways as groups of 64 heads
// allow, then may take smaller groups: their records hold as many heads in all (fewer where the
// last group is cut at Hq) but more flags.
HDK_HOST_DEVICE int64_t sparse_workspace_bytes(int64_t rows, int64_t heads, int64_t list_length,
                                               int sm_count) {
  if (rows <= 0 || heads <= 0 || list_length <= 0) return 0;
  const int groups = sparse_head_groups(heads);
  const int splits = sparse_workspace_max_splits(rows, groups, sparse_tiles(list_length), sm_count);
  if (splits <= 1) return 0;
  int64_t most = 0;
  for (int group_heads = kSparseGroupHeads; group_heads >= kSparseFewestGroupHeads;
       group_heads /= 2) {
    const int64_t bytes =
        sparse_workspace_layout(rows, sparse_head_groups(heads, group_heads), splits, group_heads)
            .bytes;
    most = bytes > most ? bytes : most;
  }
  return most;
}

// What sparse_decode_workspace_bytes promises: enough for every row count up to `rows` (the bytes
// a call needs do not grow with its rows: more rows take fewer splits).
HDK_HOST_DEVICE int64_t sparse_workspace_bytes_up_to(int64_t rows, int64_t heads,
                                                     int64_t list_length, int sm_count) {
  int64_t most = 0;
  const int64_t last = rows < sm_count ? rows : sm_count;  // beyond: no splits through it
  for (int64_t r = 1; r <= last; ++r) {
    const int64_t bytes = sparse_workspace_bytes(r, heads, list_length, sm_count);
    most = bytes > most ? bytes : most;
  }
  return most;
}

// ---- index_topk -------------------------------------------------------------------------------
// Rows up to kIndexMaxWorkspaceRows are scored over the whole GPU through the workspace; more
// rows fill the SMs with one cluster each, except rows of the FP8 forms that stream through the
// key ring, kIndexStreamRowsPerLaunch a launch (index_launch_plan.h), which the workspace holds.
constexpr int64_t kIndexMaxWorkspaceRows = 64;
constexpr int64_t kIndexStreamRowsPerLaunch = 128;

// Fewest entries a scoring CTA takes (two 64-entry tiles; index_launch_plan.h gives the
// measurement), so a row has at most ceil(capacity / kIndexScoreMinEntries) scoring CTAs.
constexpr int64_t kIndexScoreMinEntries = 128;

struct IndexWorkspaceLayout {
  int64_t rows = 0;         // rows that have a score row: min(N, kIndexStreamRowsPerLaunch)
  int64_t row_stride = 0;   // uint32 keys a score row holds (capacity rounded up to 64)
  int64_t keys_offset = 0;  // rows x row_stride uint32
  // rows x index_flag_stride int32: each scoring CTA's verdict on its share of the row (the
  // queries, weights and num_entries, alike in every CTA, and the block ids of its pages).
  int64_t flags_offset = 0;
  int64_t bytes = 0;
};

// Every scoring CTA checks the block ids of the row's first kIndexEarlyPages pages (loaded with its
// queries) and of its own pages beyond them, so a row of at most that many pages has its verdict
// in each of its flags, and the select reads the first; a longer row's is the OR of its flags.
constexpr int64_t kIndexEarlyPages = 256;

// A row's flags: one for each scoring CTA it may have, ceil(capacity / kIndexScoreMinEntries)
// (the same from the capacity rounded up to 64).
HDK_HOST_DEVICE constexpr int64_t index_flag_stride(const IndexWorkspaceLayout& layout) {
  return (layout.row_stride + kIndexScoreMinEntries - 1) / kIndexScoreMinEntries;
}

HDK_HOST_DEVICE IndexWorkspaceLayout index_workspace_layout(int64_t rows, int64_t capacity) {
  IndexWorkspaceLayout layout;
  if (rows <= 0 || capacity <= 0) return layout;
  layout.rows = rows < kIndexStreamRowsPerLaunch ? rows : kIndexStreamRowsPerLaunch;
  layout.row_stride = (capacity + 63) / 64 * 64;
  layout.keys_offset = 0;
  layout.flags_offset = workspace_round_up(layout.rows * layout.row_stride * 4);
  layout.bytes =
      layout.flags_offset + workspace_round_up(layout.rows * index_flag_stride(layout) * 4);
  return layout;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
