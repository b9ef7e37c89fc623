// The launch plan of sparse_decode's tensor-core kernels (chosen in sparse_decode_cuda.cu): how
// many CTAs a query row takes (head groups x list splits), whether its splits meet in a
// thread-block cluster or through the caller's workspace, which tiles each split walks and how
// the combine divides a row's columns. Pure functions of the shapes and of what the device runs
// at once, kept apart from the kernels so the CPU tests (tests/dsv4/sparse_decode_plan_test.cpp)
// check them without a GPU.
#pragma once

#include <cstdint>

#include "core/ceil_div.h"
#include "core/host_device.h"
#include "core/resident_clusters.h"
#include "dsv4/attention/attention_workspace.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// A CTA's head group (attention_workspace.h): 4 head tiles of 16 at most, one at least.
static_assert(kSparseGroupHeads == 64 && kSparseFewestGroupHeads == 16, "wgmma's M, one tile");
constexpr int kSparseMaxCluster = hdk::detail::kPortableClusterSize;
constexpr int kSparseMaxWideCluster = hdk::detail::kMaxClusterSize;  // where the device runs it

// A query row's CTAs: `groups` head groups x `splits` list slices. The slices are combined inside
// the row's thread-block cluster (distributed shared memory), or, with `through_workspace`, by a
// second kernel from the caller's workspace: a cluster is then one slice's head groups, so that a
// row may take more CTAs than a cluster holds.
// A head group is `group_heads` consecutive heads (64, or 32 or 16 for the fewest tiles through
// the workspace), the last one cut at Hq. Through the workspace a cluster is one split's head
// groups where `groups_share_tiles` (the pipelined kernel's shared conversion), else one CTA.
struct SparsePlan {
  int groups = 1;
  int splits = 1;
  bool through_workspace = false;
  int group_heads = kSparseGroupHeads;
  bool groups_share_tiles = true;
  // Through the workspace: the splits' partial O are bf16 (bf16 outputs;
  // sparse_bf16_records), written and combined by instances of their own.
  bool bf16_records = false;
  HDK_HOST_DEVICE int row_ctas() const { return groups * splits; }
  HDK_HOST_DEVICE int cluster() const {
    if (!through_workspace) return groups * splits;
    return groups_share_tiles ? groups : 1;
  }
  HDK_HOST_DEVICE int64_t first_head(int group) const { return int64_t{group} * group_heads; }
  // One past the group's last head of Hq heads.
  HDK_HOST_DEVICE int64_t end_head(int group, int64_t heads) const {
    const int64_t end = first_head(group) + group_heads;
    return end < heads ? end : heads;
  }
};

// Where a tensor-core kernel's CTAs leave their partial results, which picks its instance: in
// the row's cluster, or in the workspace as fp32 or bf16 records (SparsePlan::bf16_records).
enum class SparsePartials { kInCluster, kFp32Records, kBf16Records };
HDK_HOST_DEVICE SparsePartials sparse_partials(const SparsePlan& plan) {
  if (!plan.through_workspace) return SparsePartials::kInCluster;
  return plan.bf16_records ? SparsePartials::kBf16Records : SparsePartials::kFp32Records;
}

// Whether the tensor-core kernel can serve Hq heads: a multiple of 16 whose head groups fit in
// one cluster (up to 512 heads).
HDK_HOST_DEVICE bool sparse_mma_supports(int64_t heads) {
  return heads > 0 && heads % 16 == 0 &&
         hdk::detail::ceil_div(heads, kSparseGroupHeads) <= kSparseMaxCluster;
}

// The most splits a row of `groups` head groups and `tiles` tiles can take: the cluster within
// `max_cluster` CTAs, at least one tile per split. Any count up to it is a valid split: the
// slices are split_first_tile's, the combine's column slices finish_row's.
HDK_HOST_DEVICE int sparse_max_splits(int groups, int64_t tiles, int max_cluster) {
  const int64_t by_cluster = max_cluster / groups;
  const int64_t most = by_cluster < tiles ? by_cluster : tiles;
  return most > 1 ? static_cast<int>(most) : 1;
}

// What a tensor-core kernel's CTA costs the plan besides its tiles, in tile times (loading Q, the
// first tile's round trip, the combine across the cluster), and the fewest tiles a CTA should
// walk when the list is split.
struct SparseKernelCosts {
  int64_t cta_fixed_tiles;
  int64_t min_tiles_per_split;
};
// The tensor-core kernel: fitted to an H100 sweep of 1, 2, 4 and 8 splits over Flash and Pro,
// CSA and HCA lists, N = 8..64 (2026-11-23, git show
// 0712de7:bench/results/2026-11-23-h100-sparse-splits), where every cell's fastest count has the
// fewest steps for a fixed cost between 1.5 and 3.
constexpr SparseKernelCosts kSparseMmaCosts{2, 1};
// The pipelined kernel: its speed comes from the steady state, and on slices of 1 or 2 tiles the
// other kernel is as fast (sparse_decode_cuda.cu runs that one there), so splits stop at 3 tiles
// a CTA; its fixed cost is larger in tile times since its tiles are shorter. An H100 sweep of 1,
// 2, 4 and 8 splits over the four lists at N = 8..128 (2026-11-27,
// git show 0712de7:bench/results/2026-11-27-h100-sparse-mbarrier) has every cell's fastest count
// (within 1%) as the fewest steps for a fixed cost between 3 and 6; without the 3-tile floor Flash
// CSA N = 8 took 8 splits of 2 tiles on the other kernel, 1.08x the time of 4 splits of 3 here.
constexpr SparseKernelCosts kSparsePipelinedCosts{4, 3};

// Splits the list where the step takes the fewest tile times: the waves of row clusters (rows
// over the clusters of that size the device runs at once, rounded up) times what a CTA walks
// (its tiles plus the kernel's fixed cost); a split count that leaves a CTA fewer than
// `min_tiles_per_split` tiles is not taken. On an H100 this keeps a row's
// cluster resident where more splits would start a second wave (Flash CSA N = 32: 2 splits, 47.3
// us, against 4 in 2 waves, 65.3), and takes a third wave where the tiles per CTA fall far enough
// (Pro HCA N = 32: 4 splits, 3 waves of 17 tiles, 346.7 us, against 1 split of 66, 411.6; both
// on the mma kernel, 2026-11-23). With every count between the powers of two, Flash HCA N = 32
// takes 3 splits (39 clusters of 3 at once: 1 wave of 22 tiles), 77.8 us against 2 splits'
// 104.8 (pipelined kernel, 2026-11-27). A split count whose cluster size is at 0 in `resident`
// (one the device does not run) is not taken, and sizes above the portable 8 only where the
// device runs clusters of 16; one split always is (the launch reports a device that runs none).
HDK_HOST_DEVICE SparsePlan plan_sparse_decode(int64_t rows, int64_t heads, int64_t list_length,
                                              const hdk::detail::ResidentClusterCounts& resident,
                                              SparseKernelCosts costs = kSparseMmaCosts) {
  SparsePlan plan;
  plan.groups = sparse_head_groups(heads);
  const int64_t tiles = sparse_tiles(list_length);
  int64_t best = -1, best_waves = 0;
  const int max_splits = sparse_max_splits(plan.groups, tiles, resident.largest());
  for (int splits = 1; splits <= max_splits; ++splits) {
    const int64_t tiles_per_cta = hdk::detail::ceil_div(tiles, splits);
    if (splits > 1 && tiles_per_cta < costs.min_tiles_per_split) break;
    int64_t at_once = resident.by_size[plan.groups * splits];
    if (at_once <= 0) {
      if (splits > 1) continue;  // a cluster of that size does not fit the device
      at_once = 1;               // the launch itself will report it
    }
    const int64_t waves = hdk::detail::ceil_div(rows, at_once);
    const int64_t steps = waves * (tiles_per_cta + costs.cta_fixed_tiles);
    // Equal steps: the count whose CTAs walk fewer tiles on average (waves x tiles / splits),
    // e.g. a lone row in 16 slices of 4-5 tiles rather than 14 of 4-5.
    const bool fewer_on_average = steps == best && waves * plan.splits < best_waves * splits;
    if (best < 0 || steps < best || fewer_on_average) {
      best = steps;
      best_waves = waves;
      plan.splits = splits;
    }
  }
  return plan;
}

// ---- splits through the caller's workspace ------------------------------------------------------
// The combine kernel's threads a CTA, and its column slices of a row's head group: enough CTAs to
// read the partial results back from L2 over the SMs, at least 16 columns each. Up to 32 slices
// rather than 16: Pro HCA at N = 1 and 2 (two head groups, 16 splits) 1.05-1.07x (H200, N = 1
// 34.6 -> 32.4 us), every other cell the same plan or a tie; 64 slices measured the same as 32.
constexpr int kSparseCombineThreads = 256;
constexpr int kSparseCombineMaxSlices = 32;
HDK_HOST_DEVICE int sparse_combine_slices(int64_t rows, int groups, int sm_count) {
  const int64_t most = sm_count / (rows * groups);
  int slices = 1;
  while (slices < kSparseCombineMaxSlices && 2 * slices <= most)
    slices *= 2;  // a power of two divides 512 columns
  return slices;
}

// The slices the combine kernel runs: sparse_combine_slices', doubled where the SMs hold more CTAs
// than that (sm_count / (rows x groups) is not a power of two) and each thread still sums two
// column jobs (kSparseCombineMinJobs: a record's 128 fp32 quads or 64 bf16 octets a head), so
// that a thread's chain of jobs is halved on SMs that have room. H200 against the slices without
// the doubling, one call, two rounds: Pro CSA and HCA N = 9..12 (4 -> 8 slices, 512 jobs)
// 1.03-1.05x warm, 1.02-1.04x with the instruction caches flushed, Flash HCA N = 24 1.01-1.02x;
// doubled down to 128 jobs too (N = 3, 5 and 6 of both presets) they were 0.96-0.99x.
constexpr int kSparseCombineMinJobs = 2 * kSparseCombineThreads;
// A record's column units a head, one combine job each: 64 octets of bf16, 128 quads of fp32.
HDK_HOST_DEVICE int sparse_record_units(bool bf16_records) {
  return static_cast<int>(kSparseRecordColumns) / (bf16_records ? 8 : 4);
}
HDK_HOST_DEVICE int sparse_combine_launch_slices(int64_t rows, int groups, int sm_count,
                                                 int group_heads, bool bf16_records) {
  const int slices = sparse_combine_slices(rows, groups, sm_count);
  const int64_t most = sm_count / (rows * groups);
  const bool room = slices < kSparseCombineMaxSlices && slices < most;
  const int jobs = group_heads * sparse_record_units(bf16_records) / (2 * slices);
  return room && jobs >= kSparseCombineMinJobs ? 2 * slices : slices;
}

// Whether a row split through the workspace with bf16 outputs keeps its partial O as bf16
// records: half the bytes its CTAs write and the combine reads back, each combine job summing
// eight columns a split. That pays where a combine CTA of `slices` has at least
// kSparseBf16RecordJobs such jobs (on an H200 Flash N = 4..32 and Pro N = 2..32: 1.04-1.14x).
// With fewer (N = 1 in groups of 16 or 32 heads, Flash N = 2: 32 or 64 jobs, a warp or two of
// 256 threads) the combine is a chain of loads and sums per thread, which eight columns lengthen:
// bf16 records there were 0.96-1.01x warm, 0.96-0.98x cold, so those rows keep fp32 records.
constexpr int kSparseBf16RecordJobs = 128;
HDK_HOST_DEVICE bool sparse_bf16_records(int group_heads, int slices) {
  return group_heads * sparse_record_units(true) / slices >= kSparseBf16RecordJobs;
}
// The record type of `plan` through the workspace for a call of `rows` rows whose outputs are
// bf16 or not (what SparsePlan::bf16_records holds where the plan goes through it).
HDK_HOST_DEVICE bool sparse_plan_bf16_records(const SparsePlan& plan, int64_t rows, int sm_count,
                                              bool bf16_outputs) {
  return bf16_outputs &&
         sparse_bf16_records(plan.group_heads, sparse_combine_slices(rows, plan.groups, sm_count));
}

// The combine kernel's cost in tile times of the kernel before it: its launch behind the split
// kernel and the partial results it reads back from L2.
constexpr int64_t kSparseCombineTiles = 1;

// A plan's time in tile times of its kernel: the waves of its clusters (a row's splits are clusters
// of their own through the workspace) times what a CTA walks, plus the combine where there is one.
HDK_HOST_DEVICE int64_t sparse_plan_steps(const SparsePlan& plan, int64_t rows, int64_t list_length,
                                          const hdk::detail::ResidentClusterCounts& resident,
                                          SparseKernelCosts costs) {
  const int64_t tiles = sparse_tiles(list_length);
  int64_t at_once = resident.by_size[plan.cluster()];
  if (at_once <= 0) at_once = 1;
  const int64_t clusters = plan.through_workspace ? rows * plan.splits : rows;
  const int64_t waves = hdk::detail::ceil_div(clusters, at_once);
  const int64_t steps = waves * (hdk::detail::ceil_div(tiles, plan.splits) + costs.cta_fixed_tiles);
  return plan.through_workspace ? steps + kSparseCombineTiles : steps;
}

// A split through the workspace writes a 128 KiB partial result per head group and the combine
// reads it back, as many bytes as 3.5 tiles of entries: below 4 tiles a split, more splits cost
// more than they save (H200: Flash HCA N = 1 in 64 one-tile splits 51.3 us against 34.4 in one
// cluster of 16; 16 splits of 4 tiles at N = 8 37.0 against 42.0).
constexpr int64_t kSparseWorkspaceMinTiles = 4;
// Records of bf16 (sparse_bf16_records) are half those bytes, 1.75 tiles: their splits go down to
// 2 tiles a CTA, the kernel's own fewest for its longest CTA still kept. H200, against the
// cluster of 4 splits the pipelined kernel ran before, one call, two rounds: Pro CSA N = 8 (18
// tiles) in 8 splits of 2-3 tiles 28.2 -> 26.9 us warm, 33.1 -> 29.8 with the instruction caches
// flushed; N = 9..11 in 6-7 splits 1.03-1.04x warm, 1.00-1.09x cold with their combine in 8
// slices (sparse_combine_launch_slices; in 4, N = 10 and 11 read 0.97-0.99x).
constexpr int64_t kSparseWorkspaceMinTilesBf16Records = 2;
// Except for lists of 32 to 128 tiles (HCA lists of 2176 and 4224 entries), whose rows a cluster
// or 4-tile splits leave on a fraction of the SMs: there splits of 2 tiles or more. H200, against
// the rule above in one run: Flash HCA (66 tiles) N = 5 and 6 in 22-26 splits 1.09-1.12x warm,
// 1.11-1.16x with the instruction caches flushed; the decode step's HCA layer at context 262144
// (34 tiles) Pro N = 4 and 5 1.11-1.15x, Flash N = 10 and 11 1.07-1.08x. Not for the CSA lists
// (10 and 18 tiles): Pro CSA N = 9..11 in 6-7 splits 0.90-0.91x warm (fp32 records); nor beyond
// 128 tiles, where rows of 8320 entries in up to 64 splits read 0.96-1.03x.
constexpr int64_t kSparseWorkspaceShortSplitsMinListTiles = 32;
constexpr int64_t kSparseWorkspaceShortSplitsMaxListTiles = 128;
constexpr int64_t kSparseWorkspaceShortSplitTiles = 2;

// Splits through the workspace: as many as fill the SMs once (sparse_workspace_max_splits), but
// none that leaves a CTA fewer than kSparseWorkspaceMinTiles tiles (2 for lists of 32 to 128
// tiles, and for bf16 records) or the CTA that walks the most fewer than the kernel's
// `min_tiles_per_split`; through_workspace is false where that is one split. `bf16_outputs`:
// the call writes bf16, so that the plan's records are bf16 where sparse_bf16_records says so.
HDK_HOST_DEVICE SparsePlan plan_sparse_workspace(int64_t rows, int64_t heads, int64_t list_length,
                                                 int sm_count, SparseKernelCosts costs,
                                                 bool bf16_outputs = false) {
  SparsePlan plan;
  plan.groups = sparse_head_groups(heads);
  const int64_t tiles = sparse_tiles(list_length);
  int64_t splits = sparse_workspace_max_splits(rows, plan.groups, tiles, sm_count);
  const bool short_splits = tiles >= kSparseWorkspaceShortSplitsMinListTiles &&
                            tiles <= kSparseWorkspaceShortSplitsMaxListTiles;
  const bool bf16_records = sparse_plan_bf16_records(plan, rows, sm_count, bf16_outputs);
  int64_t min_tiles = kSparseWorkspaceShortSplitTiles;
  if (!short_splits && bf16_records) {
    min_tiles = kSparseWorkspaceMinTilesBf16Records;
  } else if (!short_splits) {
    min_tiles = costs.min_tiles_per_split > kSparseWorkspaceMinTiles ? costs.min_tiles_per_split
                                                                     : kSparseWorkspaceMinTiles;
  }
  const int64_t by_length = tiles / min_tiles;
  if (splits > by_length) splits = by_length;
  while (!short_splits && splits > 1 &&
         hdk::detail::ceil_div(tiles, splits) < costs.min_tiles_per_split) {
    --splits;
  }
  plan.splits = splits > 1 ? static_cast<int>(splits) : 1;
  plan.through_workspace = plan.splits > 1;
  plan.bf16_records = plan.through_workspace && bf16_records;
  return plan;
}

// Two tiles a CTA (below) only for lists of at least this many tiles: at 2 tiles a CTA, Flash CSA
// lists (10 tiles) took 0.93x at N = 20 and 26 and the HCA lists of a 8192-token context (3
// tiles) 0.90-0.91x in the step at N = 32 and 64, where lists of 18-66 tiles gained 1.05-1.30x
// (H200, instruction caches flushed; Pro CSA N = 4, HCA lists of 34 tiles at N = 2 and 4).
constexpr int64_t kSparseTwoTileMinTiles = 17;
// Rows of two head groups (65-128 heads), whose CTAs the pipelined kernel pairs in clusters to
// share each tile's conversion, take two tiles a CTA from lists of this many tiles. H200, one call,
// two rounds, against the pipelined clusters of 2 x 4: Pro HCA lists of 10 tiles (a 65536-token
// context) at N = 7..13 in 5 splits of 2 tiles 1.03-1.07x with the instruction caches flushed
// (N = 8 27.4 -> 25.7 us) and the decode step's Pro HCA layer at N = 8 1.07x (32.9 -> 30.9 us),
// but 0.87-0.89x warm: judged, as the rest of this plan, cold and by the step.
constexpr int64_t kSparseTwoTileMinTilesTwoGroups = 10;

// Lists of 2 tiles (the SWA window with its step) split into two one-tile CTAs through the
// workspace only while a call has at most this many (row, head group) pairs: the cluster's
// combine those CTAs would otherwise share costs one kernel, the workspace's a second. In the
// decode step (H200): Flash SWA N = 1..8 1.03-1.10x, Pro N = 1..4 1.03-1.11x; at 16 pairs
// 0.98-1.00x (Flash N = 16, Pro N = 8), at 32-64 pairs 0.71-0.89x.
constexpr int64_t kSparseShortListMaxRowGroups = 8;

// The fewest tiles a CTA through the workspace (the tensor-core kernel that converts on all 8
// warps), where every CTA of every row fits in one wave of the SMs: one tile a CTA, else two
// (lists of at least kSparseTwoTileMinTiles tiles, kSparseTwoTileMinTilesTwoGroups for two head
// groups, and those of 65-128 tiles, above 64 splits).
// A call then takes one or two tiles' latency, the partial's write and the combine. The
// pipelined kernel's steady state does not pay there, and its code (101-145 KB, 76 KB of it run
// at Flash CSA N = 1) is fetched cold in a decode step. On an H200 with the SMs' instruction
// caches flushed (as in a step), against the pipelined kernel: Flash CSA N = 1..13 1.14-1.48x,
// Pro CSA N = 1..3 1.30-1.41x; Flash HCA lists of 66 tiles in 33 splits 1.22-1.27x at N = 1..4,
// where 64 one-tile splits were 1.15-1.22x (their partials' bytes twice as many). With the caches
// warm it is 0.87-0.98x at Flash N = 8..13, Pro N = 3 and 4 (bench/results/sparse_decode-h200);
// the decode step is 1.05-1.6x faster wherever this plan runs (bench/results/dsv4_step-h200).
// sparse_decode_cuda.cu takes it where the dispatcher's own choice is the pipelined kernel and
// the caller gave a workspace. That includes lists of 2 tiles (up to kSparseShortListMaxRowGroups
// pairs), which the pipelined kernel leaves to the other kernel in a cluster of two.
// Where SMs are left over, the head groups shrink to 32 or 16 heads while every CTA still fits
// the wave: a CTA's partial result (its heads x 512 fp32), which leaves an SM at about 57 bytes
// a nanosecond, and its queries shrink with its heads, while the whole call's partial bytes stay
// the same (fewer heads a record, more records). Each group's CTA reads and converts the tile
// (the second reads come from L2), so the CTAs need no cluster: clusters of 4 would not all fit
// at once (an H100 runs 30 of them, 120 CTAs).
// through_workspace is false where the plan does not apply.
HDK_HOST_DEVICE SparsePlan plan_sparse_fewest_tiles(int64_t rows, int64_t heads,
                                                    int64_t list_length, int sm_count) {
  SparsePlan plan;
  plan.groups = sparse_head_groups(heads);
  const int64_t tiles = sparse_tiles(list_length);
  if (tiles < 2 || (tiles == 2 && rows * plan.groups > kSparseShortListMaxRowGroups)) return plan;
  const int most = sparse_workspace_max_splits(rows, plan.groups, tiles, sm_count);
  const int64_t two_tiles_from =
      plan.groups == 2 ? kSparseTwoTileMinTilesTwoGroups : kSparseTwoTileMinTiles;
  const int64_t longest = tiles < two_tiles_from ? 1 : 2;  // tiles a CTA
  for (int64_t per_cta = 1; per_cta <= longest; ++per_cta) {
    const int64_t splits = hdk::detail::ceil_div(tiles, per_cta);
    if (splits <= most) {
      plan.splits = static_cast<int>(splits);
      plan.through_workspace = true;
      break;
    }
  }
  if (!plan.through_workspace) return plan;
  plan.groups_share_tiles = false;
  for (int group_heads = kSparseGroupHeads / 2; group_heads >= kSparseFewestGroupHeads;
       group_heads /= 2) {
    const int groups = sparse_head_groups(heads, group_heads);
    if (rows * groups * plan.splits > sm_count ||
        groups * plan.splits > kSparseMaxWorkspaceRowCtas) {
      break;
    }
    plan.groups = groups;
    plan.group_heads = group_heads;
  }
  return plan;
}

// The combine's share of split `split` of `splits`: the column units [first, first + count) of
// every head (of a 512-column row's `units`: 128 quads of fp32 partials, 64 octets of bf16 ones),
// and `inverse` = ceil(2^32 / count), with which head_of_job turns a job number (head x count +
// unit) into its head by a multiply-high.
struct CombineSlice {
  int first;
  int count;
  uint32_t inverse;
};
HDK_HOST_DEVICE CombineSlice combine_slice(int split, int splits, int units = 128) {
  const int first = units * split / splits;
  const int count = units * (split + 1) / splits - first;
  return CombineSlice{first, count, 0xffffffffu / static_cast<uint32_t>(count) + 1u};
}
// job / count for count >= 2 (a slice has at least 64 / 16 units), exact while job x count <
// 2^32, which the combine's jobs (under 64 x 128 x 128) are: the rounding of `inverse` adds less
// than job / 2^32 < 1 / count to the true quotient.
HDK_HOST_DEVICE int head_of_job(uint32_t job, uint32_t inverse) {
#if defined(__CUDA_ARCH__)
  return static_cast<int>(__umulhi(job, inverse));
#else
  return static_cast<int>((uint64_t{job} * inverse) >> 32);
#endif
}

// The tiles [first, last) of the list that split `split` of `splits` walks.
HDK_HOST_DEVICE int64_t split_first_tile(int64_t tiles, int split, int splits) {
  return tiles * split / splits;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
