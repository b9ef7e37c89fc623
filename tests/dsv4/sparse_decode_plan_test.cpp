// The launch plan of sparse_decode's tensor-core kernels
// (src/dsv4/sparse_decode/cuda/sparse_decode_plan.h), checked on the CPU: the combine's column
// slices, the split counts against measured H100 cases, and the splits through the workspace
// against the SMs and the workspace size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/resident_clusters.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"

namespace hdk {
namespace testing {
namespace {

// The combine's column slices of any split count cover a row's 128 column quads (64 octets for
// bf16 partials) once, and head_of_job recovers every job's head exactly.
TEST(SparseDecodePlan, CombineSlicesCoverTheColumnsAndFindEveryHead) {
  for (const int units : {128, 64}) {
    for (int splits = 1; splits <= dsv4::detail::kSparseMaxWideCluster; ++splits) {
      int covered = 0;
      for (int split = 0; split < splits; ++split) {
        const dsv4::detail::CombineSlice slice = dsv4::detail::combine_slice(split, splits, units);
        ASSERT_EQ(slice.first, covered) << units << " " << splits << " " << split;
        ASSERT_GE(slice.count, units / splits);
        ASSERT_LE(slice.count, units / splits + 1);
        covered += slice.count;
        for (uint32_t job = 0; job < 64u * static_cast<uint32_t>(slice.count); ++job) {
          ASSERT_EQ(dsv4::detail::head_of_job(job, slice.inverse),
                    static_cast<int>(job / static_cast<uint32_t>(slice.count)))
              << units << " " << splits << " " << split << " " << job;
        }
      }
      ASSERT_EQ(covered, units) << splits;
    }
  }
  // Beyond the combine's jobs too: every count from 2 (ceil(2^32 / 1) needs 33 bits; a slice
  // has at least 4 units) to 128, up to 2^16 jobs.
  for (int count = 2; count <= 128; ++count) {
    const uint32_t inverse = 0xffffffffu / static_cast<uint32_t>(count) + 1u;
    for (uint32_t job = 0; job < (1u << 16); job += 7) {
      ASSERT_EQ(dsv4::detail::head_of_job(job, inverse), static_cast<int>(job / count)) << count;
    }
  }
}

TEST(SparseDecodePlan, PlanTakesTheFewestTileSteps) {
  using dsv4::detail::plan_sparse_decode;
  // What an H100 runs at once (cudaOccupancyMaxActiveClusters, 2026-11-23): clusters of 1, 2, 4
  // and 8 CTAs.
  hdk::detail::ResidentClusterCounts h100;
  h100.by_size[1] = 132, h100.by_size[2] = 66, h100.by_size[4] = 31, h100.by_size[8] = 15;
  struct Case {
    int64_t rows, heads, length;
    int groups, splits;
  };
  for (const Case& c : {
           Case{32, 64, 640, 1, 2},     // Flash CSA: 4 splits would need 2 waves of 3 tiles
           Case{32, 128, 1152, 2, 1},   // Pro CSA: 1 x (18 + 2) against 3 waves x (5 + 2)
           Case{32, 128, 4224, 2, 4},   // Pro HCA: 3 x (17 + 2) against 1 x (66 + 2)
           Case{32, 64, 4224, 1, 8},    // Flash HCA: 3 x (9 + 2) against 1 x (33 + 2)
           Case{16, 64, 640, 1, 4},     // 8 splits: 2 waves of 2 tiles, 4: 1 of 3
           Case{128, 64, 640, 1, 1},    // 2 splits: 2 waves of 5, a tie: fewer splits
           Case{128, 128, 4224, 2, 1},  // Pro HCA: 2 waves of 66 against 5 of 33
           Case{1, 128, 4224, 2, 4},    // the cluster limit: 2 groups x 4 splits
           Case{1, 64, 4224, 1, 8},     //
           Case{1, 64, 100, 1, 2},      // one tile per split
           Case{4, 512, 4224, 8, 1},    // 8 head groups fill the cluster
           Case{1, 16, 0, 1, 1},        // an empty list
       }) {
    const dsv4::detail::SparsePlan plan = plan_sparse_decode(c.rows, c.heads, c.length, h100);
    EXPECT_EQ(plan.groups, c.groups) << c.rows << " " << c.heads << " " << c.length;
    EXPECT_EQ(plan.splits, c.splits) << c.rows << " " << c.heads << " " << c.length;
  }
  // The pipelined kernel's costs: a fixed 4 tiles a CTA and no split below 3 tiles.
  for (const Case& c : {
           Case{8, 64, 640, 1, 4},     // Flash CSA: 8 splits would leave 2 tiles a CTA
           Case{32, 64, 4224, 1, 2},   // Flash HCA: 1 x (33 + 4) against 3 waves x (9 + 4)
           Case{32, 128, 4224, 2, 4},  // Pro HCA: 3 x (17 + 4) against 1 x (66 + 4)
           Case{32, 128, 1152, 2, 1},  // Pro CSA
           Case{1, 64, 100, 1, 1},     // 2 tiles: no split leaves 3
           Case{1, 64, 4224, 1, 8},    // 9 tiles a CTA
       }) {
    const dsv4::detail::SparsePlan plan =
        plan_sparse_decode(c.rows, c.heads, c.length, h100, dsv4::detail::kSparsePipelinedCosts);
    EXPECT_EQ(plan.groups, c.groups) << c.rows << " " << c.heads << " " << c.length;
    EXPECT_EQ(plan.splits, c.splits) << c.rows << " " << c.heads << " " << c.length;
  }
  // Where the device runs clusters of 16 (a non-portable size; 7 at once here), a row may take
  // 16 CTAs; without them, never more than 8.
  hdk::detail::ResidentClusterCounts wide = h100;
  wide.by_size[16] = 7;
  for (const Case& c : {
           Case{1, 64, 4224, 1, 16},  // Flash HCA: 1 x (5 + 4) against 1 x (9 + 4)
           Case{4, 64, 4224, 1, 16},  // 4 clusters of 16 at once
           Case{8, 64, 4224, 1, 8},   // 8 of 16 need 2 waves: 2 x (5 + 4) against 13
           Case{1, 128, 1152, 2, 8},  // Pro CSA: 2 groups x 8 splits of 3 tiles
           Case{1, 128, 4224, 2, 8},  // Pro HCA: 9 + 4 against 17 + 4
           Case{1, 64, 640, 1, 4},    // Flash CSA: 8 splits would leave 2 tiles a CTA
       }) {
    const dsv4::detail::SparsePlan plan =
        plan_sparse_decode(c.rows, c.heads, c.length, wide, dsv4::detail::kSparsePipelinedCosts);
    EXPECT_EQ(plan.groups, c.groups) << c.rows << " " << c.heads << " " << c.length;
    EXPECT_EQ(plan.splits, c.splits) << c.rows << " " << c.heads << " " << c.length;
    EXPECT_EQ(
        plan_sparse_decode(c.rows, c.heads, c.length, h100, dsv4::detail::kSparsePipelinedCosts)
                .cluster() <= dsv4::detail::kSparseMaxCluster,
        true);
  }
  // A cluster size the device cannot run is never planned.
  hdk::detail::ResidentClusterCounts small = h100;
  small.by_size[8] = 0;
  EXPECT_EQ(plan_sparse_decode(1, 64, 4224, small).splits, 4);
  for (int64_t rows : {1, 2, 7, 33, 200}) {
    for (int64_t heads : {16, 48, 64, 128, 320, 512}) {
      for (int64_t length : {0, 1, 64, 65, 700, 4224, 9000}) {
        const dsv4::detail::SparsePlan plan = plan_sparse_decode(rows, heads, length, h100);
        EXPECT_LE(plan.cluster(), dsv4::detail::kSparseMaxCluster);
        EXPECT_EQ(plan.groups * 64 >= heads && (plan.groups - 1) * 64 < heads, true);
        EXPECT_GE(plan.splits, 1);
        // The splits' tiles partition the list.
        const int64_t tiles = (length + dsv4::detail::kSparseTile - 1) / dsv4::detail::kSparseTile;
        int64_t covered = 0;
        for (int s = 0; s < plan.splits; ++s) {
          const int64_t first = dsv4::detail::split_first_tile(tiles, s, plan.splits);
          const int64_t last = dsv4::detail::split_first_tile(tiles, s + 1, plan.splits);
          EXPECT_EQ(first, covered);
          EXPECT_LE(first, last);
          covered = last;
        }
        EXPECT_EQ(covered, tiles);
      }
    }
  }
  // Every cluster size an H100 runs (cudaOccupancyMaxActiveClusters for the pipelined kernel,
  // 2026-11-27): a split count between the powers of two is taken where it saves a wave.
  hdk::detail::ResidentClusterCounts every;
  const int h100_every[] = {0, 132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7};
  for (int size = 1; size <= 16; ++size)
    every.by_size[size] = h100_every[size];
  for (const Case& c : {
           Case{32, 64, 4224, 1, 3},   // Flash HCA: 1 x (22 + 4) against 1 x (33 + 4)
           Case{16, 64, 4224, 1, 6},   // 1 x (11 + 4) against 2 x (10 + 4) in 7
           Case{8, 64, 4224, 1, 9},    // 1 x (8 + 4) against 1 x (9 + 4) in 8
           Case{1, 64, 4224, 1, 16},   // 16 slices of 4-5 tiles: the steps of 14, fewer on average
           Case{16, 128, 4224, 2, 3},  // Pro: clusters of 6, 1 x (22 + 4) against 1 x (33 + 4)
           Case{32, 128, 4224, 2, 3},  // 2 x (22 + 4) against 3 x (17 + 4) in clusters of 8
           Case{16, 128, 1152, 2, 3},  // Pro CSA: 1 x (6 + 4) against 1 x (9 + 4)
           Case{64, 64, 4224, 1, 2},   // 3 splits would take 2 waves
           Case{128, 64, 4224, 1, 1},  //
       }) {
    const dsv4::detail::SparsePlan plan =
        plan_sparse_decode(c.rows, c.heads, c.length, every, dsv4::detail::kSparsePipelinedCosts);
    EXPECT_EQ(plan.groups, c.groups) << c.rows << " " << c.heads << " " << c.length;
    EXPECT_EQ(plan.splits, c.splits) << c.rows << " " << c.heads << " " << c.length;
  }
  EXPECT_EQ(dsv4::detail::sparse_max_splits(1, 66, 8), 8);
  EXPECT_EQ(dsv4::detail::sparse_max_splits(3, 66, 16), 5);  // 15 CTAs
  EXPECT_EQ(dsv4::detail::sparse_max_splits(2, 3, 16), 3);   // one tile a split
  EXPECT_EQ(dsv4::detail::sparse_max_splits(1, 0, 8), 1);
  EXPECT_EQ(dsv4::detail::sparse_max_splits(5, 66, 8), 1);
  EXPECT_TRUE(dsv4::detail::sparse_mma_supports(16));
  EXPECT_TRUE(dsv4::detail::sparse_mma_supports(512));
  EXPECT_FALSE(dsv4::detail::sparse_mma_supports(8));
  EXPECT_FALSE(dsv4::detail::sparse_mma_supports(17));
  EXPECT_FALSE(dsv4::detail::sparse_mma_supports(528));
}

// Splits through the workspace fill the SMs once (a row at most kSparseMaxWorkspaceRowCtas CTAs,
// the flags the combine reads one a thread, on a device of any SM count), keep the kernel's
// fewest tiles a CTA, and need no more bytes than the public size promises for any row count up
// to the call's.
TEST(SparseDecodePlan, WorkspacePlansFitTheSmsAndTheWorkspace) {
  using dsv4::detail::kSparseMmaCosts;
  using dsv4::detail::kSparsePipelinedCosts;
  using dsv4::detail::SparsePlan;
  for (int sm_count : {132, 114, 78, 1000}) {
    for (int64_t heads : {64, 128, 96, 512}) {
      for (int64_t length : {1, 64, 65, 640, 1152, 4224, 16512}) {
        int64_t previous_promise = 0;
        for (int64_t rows = 1; rows <= 160; rows += rows < 8 ? 1 : 7) {
          SCOPED_TRACE(std::to_string(sm_count) + " SMs, " + std::to_string(rows) + " x " +
                       std::to_string(heads) + " heads x " + std::to_string(length));
          const int64_t promise =
              dsv4::detail::sparse_workspace_bytes_up_to(rows, heads, length, sm_count);
          EXPECT_GE(promise, previous_promise);  // grows with the rows
          previous_promise = promise;
          for (const auto& costs : {kSparseMmaCosts, kSparsePipelinedCosts}) {
            for (bool bf16_outputs : {false, true}) {
              const SparsePlan plan = dsv4::detail::plan_sparse_workspace(
                  rows, heads, length, sm_count, costs, bf16_outputs);
              const int64_t tiles = dsv4::detail::sparse_tiles(length);
              EXPECT_EQ(plan.groups, dsv4::detail::sparse_head_groups(heads));
              if (!plan.through_workspace) {
                EXPECT_EQ(plan.splits, 1);
                EXPECT_FALSE(plan.bf16_records);
                continue;
              }
              EXPECT_GE(plan.splits, 2);
              EXPECT_LE(plan.splits, dsv4::detail::kSparseMaxWorkspaceSplits);
              EXPECT_LE(rows * plan.groups * plan.splits, sm_count);  // one wave
              EXPECT_LE(plan.row_ctas(), dsv4::detail::kSparseMaxWorkspaceRowCtas);
              // The records the dispatcher gives the plan.
              EXPECT_EQ(plan.bf16_records,
                        bf16_outputs && dsv4::detail::sparse_bf16_records(
                                            plan.group_heads, dsv4::detail::sparse_combine_slices(
                                                                  rows, plan.groups, sm_count)));
              // Lists of 32 to 128 tiles split down to 2 tiles a CTA, and bf16 records too with
              // the kernel's own fewest for the longest CTA; the others to 4 and that fewest.
              if (tiles >= 32 && tiles <= 128) {
                EXPECT_GE(tiles / plan.splits, 2);
              } else if (plan.bf16_records) {
                EXPECT_GE(tiles / plan.splits, 2);
                EXPECT_GE((tiles + plan.splits - 1) / plan.splits, costs.min_tiles_per_split);
              } else {
                EXPECT_GE(tiles / plan.splits, costs.min_tiles_per_split);
                EXPECT_GE(tiles / plan.splits, dsv4::detail::kSparseWorkspaceMinTiles);
              }
              EXPECT_EQ(plan.cluster(), plan.groups);
              EXPECT_LE(dsv4::detail::sparse_workspace_layout(rows, plan.groups, plan.splits).bytes,
                        promise);
            }
          }
          const int slices = dsv4::detail::sparse_combine_slices(
              rows, dsv4::detail::sparse_head_groups(heads), sm_count);
          EXPECT_EQ(512 % slices, 0);
          EXPECT_LE(slices, dsv4::detail::kSparseCombineMaxSlices);
        }
      }
    }
  }
  // Each part of the layout on its own 256-byte boundary, past the one before.
  const dsv4::detail::SparseWorkspaceLayout layout = dsv4::detail::sparse_workspace_layout(3, 2, 5);
  EXPECT_EQ(layout.records, 30);
  EXPECT_EQ(layout.stats_offset, 30 * 64 * 512 * 4);
  EXPECT_EQ(layout.flags_offset % 256, 0);
  EXPECT_GE(layout.flags_offset, layout.stats_offset + 30 * 128 * 4);
  EXPECT_GE(layout.bytes, layout.flags_offset + 30 * 4);
  // Rows of one SM each take no workspace; a lone Flash HCA row of 66 tiles takes 33 splits of
  // 2 tiles (its list is one of 32-128 tiles), eight rows of it 16 (128 CTAs), nine rows 14; a
  // Pro CSA row of 18 tiles stops at 4 tiles a split (4 splits at 8 rows), one of 130 tiles too
  // (32 splits).
  EXPECT_EQ(dsv4::detail::sparse_workspace_bytes(132, 64, 640, 132), 0);
  EXPECT_EQ(dsv4::detail::plan_sparse_workspace(1, 64, 4224, 132, kSparsePipelinedCosts).splits,
            33);
  EXPECT_EQ(dsv4::detail::plan_sparse_workspace(8, 128, 1152, 132, kSparsePipelinedCosts).splits,
            4);
  // With bf16 outputs its records are bf16 and its splits go down to 2 tiles, the longest CTA
  // keeping the pipelined kernel's 3: 8 splits at 8 rows (2-3 tiles), 6 at 11, none below 3 for
  // a Flash CSA row of 10 tiles at 16 rows (4 splits, not 5).
  const SparsePlan pro_bf16 =
      dsv4::detail::plan_sparse_workspace(8, 128, 1152, 132, kSparsePipelinedCosts, true);
  EXPECT_EQ(pro_bf16.splits, 8);
  EXPECT_TRUE(pro_bf16.bf16_records);
  EXPECT_EQ(
      dsv4::detail::plan_sparse_workspace(11, 128, 1152, 132, kSparsePipelinedCosts, true).splits,
      6);
  EXPECT_EQ(
      dsv4::detail::plan_sparse_workspace(16, 64, 640, 132, kSparsePipelinedCosts, true).splits, 4);
  EXPECT_EQ(dsv4::detail::plan_sparse_workspace(1, 64, 8320, 132, kSparsePipelinedCosts).splits,
            32);
  EXPECT_EQ(dsv4::detail::plan_sparse_workspace(8, 64, 4224, 132, kSparsePipelinedCosts).splits,
            16);
  EXPECT_EQ(dsv4::detail::plan_sparse_workspace(9, 64, 4224, 132, kSparsePipelinedCosts).splits,
            14);
  EXPECT_EQ(dsv4::detail::plan_sparse_workspace(1, 64, 640, 132, kSparseMmaCosts).splits, 2);
  // On a device of 1000 SMs a lone row of 512 heads (8 groups) and 16512 entries takes 32 splits,
  // not 64: 256 CTAs.
  EXPECT_EQ(dsv4::detail::sparse_workspace_max_splits(1, 8, 258, 1000), 32);
}

// The fewest tiles a CTA through the workspace: one tile a CTA, else two for lists of 17 tiles
// or more, exactly where all of every row's CTAs fit in one wave, then head groups of 32 or 16
// while they still fit it, within the workspace sparse_decode_workspace_bytes promised for those
// rows.
TEST(SparseDecodePlan, FewestTilesTakeOneWaveOfTheSms) {
  for (int sm_count : {132, 114, 78, 1000}) {
    for (int64_t heads : {16, 48, 64, 80, 128, 96, 512}) {
      for (int64_t length : {1, 128, 129, 192, 640, 1152, 4096, 4097, 4224, 8192, 8193, 16512}) {
        for (int64_t rows = 1; rows <= 160; rows += rows < 16 ? 1 : 9) {
          SCOPED_TRACE(std::to_string(sm_count) + " SMs, " + std::to_string(rows) + " x " +
                       std::to_string(heads) + " heads x " + std::to_string(length));
          const dsv4::detail::SparsePlan plan =
              dsv4::detail::plan_sparse_fewest_tiles(rows, heads, length, sm_count);
          const int groups = dsv4::detail::sparse_head_groups(heads);
          const int64_t tiles = dsv4::detail::sparse_tiles(length);
          // One tile a CTA where a wave holds them all, else two for lists of 17 tiles or more
          // (10 for two head groups); lists of 2 tiles up to 8 (row, head group) pairs.
          auto fit = [&](int64_t splits, int64_t group_count) {
            return splits <= dsv4::detail::kSparseMaxWorkspaceSplits &&
                   rows * group_count * splits <= sm_count &&
                   group_count * splits <= dsv4::detail::kSparseMaxWorkspaceRowCtas;
          };
          const int64_t splits = fit(tiles, groups) ? tiles : (tiles + 1) / 2;
          const bool short_fits = tiles > 2 || rows * groups <= 8;
          const bool fits = tiles >= 2 && short_fits && fit(splits, groups) &&
                            (splits == tiles || tiles >= (groups == 2 ? 10 : 17));
          EXPECT_EQ(plan.through_workspace, fits);
          if (!fits) {
            EXPECT_EQ(plan.groups, groups);
            EXPECT_EQ(plan.group_heads, 64);
            EXPECT_EQ(plan.splits, 1);
            continue;
          }
          EXPECT_EQ(plan.splits, splits);
          EXPECT_LE(plan.splits, dsv4::detail::kSparseMaxWorkspaceSplits);
          // The smallest group (64, 32, 16 heads) whose CTAs fit.
          int group_heads = 64;
          while (group_heads > 16 && fit(splits, (heads + group_heads / 2 - 1) / (group_heads / 2)))
            group_heads /= 2;
          EXPECT_EQ(plan.group_heads, group_heads);
          EXPECT_EQ(plan.groups, dsv4::detail::sparse_head_groups(heads, group_heads));
          EXPECT_LE(rows * plan.row_ctas(), sm_count);  // one wave
          EXPECT_EQ(plan.cluster(), 1);                 // the groups convert their tiles each
          // Every head in exactly one group; the last cut at Hq.
          EXPECT_EQ(plan.first_head(plan.groups - 1) < heads, true);
          EXPECT_EQ(plan.end_head(plan.groups - 1, heads), heads);
          EXPECT_EQ(plan.end_head(0, heads), std::min<int64_t>(heads, group_heads));
          EXPECT_LE(dsv4::detail::sparse_workspace_layout(rows, plan.groups, plan.splits,
                                                          plan.group_heads)
                        .bytes,
                    dsv4::detail::sparse_workspace_bytes(rows, heads, length, sm_count));
        }
      }
    }
  }
  // 132 SMs: Flash CSA rows (10 tiles) in groups of 16 heads up to 3 rows, 32 up to 6, 64 from
  // 7; Pro CSA (18 tiles) in groups of 32 at one row; Flash HCA (66 tiles, 33 splits) in groups
  // of 16 at one row.
  using dsv4::detail::plan_sparse_fewest_tiles;
  EXPECT_EQ(plan_sparse_fewest_tiles(3, 64, 640, 132).group_heads, 16);
  EXPECT_EQ(plan_sparse_fewest_tiles(4, 64, 640, 132).group_heads, 32);
  EXPECT_EQ(plan_sparse_fewest_tiles(6, 64, 640, 132).group_heads, 32);
  EXPECT_EQ(plan_sparse_fewest_tiles(7, 64, 640, 132).group_heads, 64);
  EXPECT_EQ(plan_sparse_fewest_tiles(1, 128, 1152, 132).group_heads, 32);
  EXPECT_EQ(plan_sparse_fewest_tiles(2, 128, 1152, 132).group_heads, 64);
  EXPECT_EQ(plan_sparse_fewest_tiles(1, 64, 4224, 132).group_heads, 16);
  // Flash CSA lists (10 tiles) up to 13 rows, Pro's (2 groups x 18 tiles) one tile a CTA up to 3
  // rows and two up to 7; an HCA list of 4224 entries (66 tiles) in 33 splits of two tiles up to
  // 4 rows; SWA lists (2 tiles) up to 8 Flash rows and 4 Pro rows; none of 8256 entries (130
  // tiles).
  EXPECT_EQ(plan_sparse_fewest_tiles(13, 64, 640, 132).splits, 10);
  EXPECT_FALSE(plan_sparse_fewest_tiles(14, 64, 640, 132).through_workspace);
  EXPECT_EQ(plan_sparse_fewest_tiles(3, 128, 1152, 132).splits, 18);
  EXPECT_EQ(plan_sparse_fewest_tiles(4, 128, 1152, 132).splits, 9);
  EXPECT_EQ(plan_sparse_fewest_tiles(7, 128, 1152, 132).splits, 9);
  EXPECT_FALSE(plan_sparse_fewest_tiles(8, 128, 1152, 132).through_workspace);
  // Pro's HCA lists of a 65536-token context (2 groups x 10 tiles): one tile a CTA up to 6 rows,
  // two up to 13; Flash's (one group) one tile only.
  EXPECT_EQ(plan_sparse_fewest_tiles(6, 128, 640, 132).splits, 10);
  EXPECT_EQ(plan_sparse_fewest_tiles(7, 128, 640, 132).splits, 5);
  EXPECT_EQ(plan_sparse_fewest_tiles(13, 128, 640, 132).splits, 5);
  EXPECT_FALSE(plan_sparse_fewest_tiles(14, 128, 640, 132).through_workspace);
  EXPECT_FALSE(plan_sparse_fewest_tiles(8, 128, 576, 132).through_workspace);  // 9 tiles
  EXPECT_EQ(plan_sparse_fewest_tiles(4, 64, 4224, 132).splits, 33);
  EXPECT_FALSE(plan_sparse_fewest_tiles(5, 64, 4224, 132).through_workspace);
  EXPECT_EQ(plan_sparse_fewest_tiles(8, 64, 128, 132).splits, 2);
  EXPECT_FALSE(plan_sparse_fewest_tiles(9, 64, 128, 132).through_workspace);
  EXPECT_EQ(plan_sparse_fewest_tiles(4, 128, 128, 132).splits, 2);
  EXPECT_FALSE(plan_sparse_fewest_tiles(5, 128, 128, 132).through_workspace);
  EXPECT_FALSE(plan_sparse_fewest_tiles(1, 64, 64, 132).through_workspace);
  EXPECT_FALSE(plan_sparse_fewest_tiles(1, 64, 8256, 132).through_workspace);
}

// The combine kernel's slices double where the SMs hold more CTAs than the power of two below
// and each thread keeps two jobs: 4 -> 8 for Pro's two groups of bf16 records at 9-12 rows on 132
// SMs, never past 32, never where the count already fills the SMs or where a thread would be
// left one job or less.
TEST(SparseDecodePlan, CombineSlicesDoubleWhereThreadsKeepTwoJobs) {
  using dsv4::detail::sparse_combine_launch_slices;
  using dsv4::detail::sparse_combine_slices;
  for (int64_t rows : {9, 10, 11, 12}) {
    EXPECT_EQ(sparse_combine_slices(rows, 2, 132), 4);
    EXPECT_EQ(sparse_combine_launch_slices(rows, 2, 132, 64, true), 8);
  }
  EXPECT_EQ(sparse_combine_launch_slices(8, 2, 132, 64, true), 8);     // 8 fill the SMs
  EXPECT_EQ(sparse_combine_launch_slices(12, 1, 132, 64, true), 8);    // 16 would leave 256 jobs
  EXPECT_EQ(sparse_combine_launch_slices(12, 1, 132, 64, false), 16);  // fp32 records: 512 jobs
  EXPECT_EQ(sparse_combine_launch_slices(3, 4, 132, 16, false), 8);    // 16 heads: 128 jobs
  EXPECT_EQ(sparse_combine_launch_slices(1, 1, 132, 64, false), 32);   // the most
  EXPECT_EQ(sparse_combine_launch_slices(200, 1, 132, 64, false), 1);  // rows beyond the SMs
  for (int sm_count : {132, 114, 78, 1000}) {
    for (int64_t rows = 1; rows <= 160; ++rows) {
      for (int groups : {1, 2, 4, 8}) {
        for (int group_heads : {16, 32, 64}) {
          for (bool bf16 : {false, true}) {
            const int base = sparse_combine_slices(rows, groups, sm_count);
            const int slices =
                sparse_combine_launch_slices(rows, groups, sm_count, group_heads, bf16);
            EXPECT_TRUE(slices == base || slices == 2 * base);
            EXPECT_LE(slices, dsv4::detail::kSparseCombineMaxSlices);
            EXPECT_EQ(512 % slices, 0);
            if (slices == 2 * base) {
              EXPECT_LT(rows * groups * base, sm_count);
              EXPECT_GE(group_heads * (bf16 ? 64 : 128) / slices,
                        dsv4::detail::kSparseCombineMinJobs);
            }
          }
        }
      }
    }
  }
}

// bf16 records where a combine CTA has at least 128 eight-column jobs (group heads x 64 octets
// over its slices). The plans an H200 (132 SMs) takes: a Flash CSA row in four groups of 16 heads
// (32 slices: 32 jobs) and two rows (16 slices: 64 jobs) keep fp32 records, four rows in groups
// of 32 (16 slices: 128 jobs) and eight rows of one group take bf16 ones; a Pro CSA row in four
// groups of 32 (32 slices: 64 jobs) keeps fp32, two rows of two groups of 64 (32 slices: 128
// jobs) take bf16.
TEST(SparseDecodePlan, Bf16RecordsWhereTheCombineHasJobsForItsThreads) {
  using dsv4::detail::sparse_bf16_records;
  EXPECT_FALSE(sparse_bf16_records(16, 32));
  EXPECT_FALSE(sparse_bf16_records(16, 16));
  EXPECT_FALSE(sparse_bf16_records(32, 32));
  EXPECT_TRUE(sparse_bf16_records(32, 16));
  EXPECT_TRUE(sparse_bf16_records(64, 32));
  EXPECT_TRUE(sparse_bf16_records(16, 8));
  auto records = [](int64_t rows, int64_t heads, int64_t length) {
    const dsv4::detail::SparsePlan plan =
        dsv4::detail::plan_sparse_fewest_tiles(rows, heads, length, 132);
    EXPECT_TRUE(plan.through_workspace);
    return sparse_bf16_records(plan.group_heads,
                               dsv4::detail::sparse_combine_slices(rows, plan.groups, 132));
  };
  EXPECT_FALSE(records(1, 64, 640));
  EXPECT_FALSE(records(2, 64, 640));
  EXPECT_TRUE(records(4, 64, 640));
  EXPECT_TRUE(records(8, 64, 640));
  EXPECT_FALSE(records(1, 128, 1152));
  EXPECT_TRUE(records(2, 128, 1152));
}

}  // namespace
}  // namespace testing
}  // namespace hdk
