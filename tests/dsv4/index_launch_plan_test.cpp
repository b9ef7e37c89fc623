// index_topk's CUDA launch plan (src/dsv4/index_topk/index_launch_plan.h), checked on the CPU over
// a grid of calls and two devices' limits: the shared-memory regions the kernel uses at the same
// time do not overlap, the total fits the device, the scores of rows up to 8 x 32768 entries stay
// resident (no rescoring), and the planner refuses head counts that leave no room for scores; with
// the caller's workspace, which calls score over every SM, in how many CTAs, and that the scoring
// and select kernels' regions fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fast_divide.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/index_topk/index_mma_layout.h"
#include "hdk/error.h"
#include "topk/select_layout.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr int kH100Shared = 232448;  // opt-in shared memory per CTA, H100 and H200
constexpr int kH100Sms = 132;

struct Call {
  int64_t rows, heads, capacity, top_k;
  bool tensor, fp32_q;
  int sms, shared;
  size_t key_ring = 0;       // the E4M3 scoring kernel's key ring (fp8_key_ring_bytes), else 0
  bool whole_pages = false;  // its tiles copied as whole pieces of pages
  std::string describe() const {
    return "N=" + std::to_string(rows) + " H=" + std::to_string(heads) +
           " capacity=" + std::to_string(capacity) + " top_k=" + std::to_string(top_k) +
           (tensor ? " tensor" : " cuda-core") + (fp32_q ? " fp32" : " bf16") +
           " sms=" + std::to_string(sms) + " shared=" + std::to_string(shared) +
           " key_ring=" + std::to_string(key_ring) + (whole_pages ? " whole pages" : "");
  }
};

// The E4M3 scoring kernel's key ring: two warpgroups'.
const size_t kE4m3Ring = fp8_key_ring_bytes(2);

IndexRingRows ring_rows_of(const Call& c) {
  return c.whole_pages ? IndexRingRows::kEvery : IndexRingRows::kByLength;
}

void check_plan(const Call& c) {
  SCOPED_TRACE(c.describe());
  IndexLaunchPlan plan;
  try {
    plan = plan_index_launch(c.rows, c.heads, c.capacity, c.top_k, c.tensor, c.fp32_q, c.sms,
                             c.shared);
  } catch (const Error&) {
    // Only when rescoring is needed and the select, weights, queries and the smallest chunk of
    // scores together exceed the device.
    int sort_capacity = 1;
    while (sort_capacity < std::min<int64_t>(c.top_k, std::max<int64_t>(c.capacity, 1)))
      sort_capacity <<= 1;
    const int64_t m_tiles = (c.heads + kMmaM - 1) / kMmaM;
    const int64_t staged = c.tensor && c.heads <= 64 ? 64 : m_tiles * kMmaM;
    const int64_t q_bytes = c.tensor ? staged * 128 * 2 * (c.fp32_q ? 2 : 1) : c.heads * 128 * 4;
    const int64_t select_bytes =
        (static_cast<int64_t>(hdk::detail::select_layout(sort_capacity).bytes) + 15) / 16 * 16;
    const int64_t q_offset =
        (select_bytes + staged * 4 + kIndexCachedPages * 4 + 1023) / 1024 * 1024;
    const int64_t needed = q_offset + q_bytes + kIndexMinChunk * 4 + 1024;
    ASSERT_GT(needed, c.shared) << "refused a call that fits";
    ASSERT_GT(c.capacity, kIndexMinChunk) << "refused a call whose scores fit";
    return;
  }
  const IndexLaunch& l = plan.launch;
  const int C = plan.cluster_size;
  ASSERT_TRUE(C >= 1 && C <= kIndexMaxCluster);  // no clusters above 8 without capacity
  // The select needs room for every winner a row can have.
  ASSERT_EQ(l.sort_capacity & (l.sort_capacity - 1), 0);
  ASSERT_GE(l.sort_capacity, std::min<int64_t>(c.top_k, std::max<int64_t>(c.capacity, 1)));
  ASSERT_LE(l.sort_capacity, 2048);
  ASSERT_EQ(l.m_tiles * kMmaM >= c.heads && (l.m_tiles - 1) * kMmaM < c.heads, true);
  // The warpgroup kernel's 64 heads wherever it may run, else the warp kernel's tiles.
  ASSERT_EQ(l.staged_heads, c.tensor && c.heads <= 64 ? 64 : l.m_tiles * kMmaM);
  for (size_t offset : {l.weights, l.q, l.q_lo, l.scores})
    ASSERT_EQ(offset % 16, 0u);
  if (c.tensor) {
    ASSERT_EQ(l.q % 1024, 0u);  // wgmma's swizzle atoms
  }
  ASSERT_GT(l.chunk, 0);
  ASSERT_EQ(l.chunk % 32, 0);
  ASSERT_LE(l.chunk, kIndexMaxChunk);
  ASSERT_LE(l.bytes, static_cast<size_t>(c.shared));
  // Room to align the start to 1024 bytes.
  ASSERT_EQ(l.bytes, l.scores + static_cast<size_t>(l.chunk) * 4 + 1024);

  const size_t select_end = hdk::detail::select_layout(l.sort_capacity).bytes;
  const size_t fragment_bytes = static_cast<size_t>(l.staged_heads) * 128 * 2;
  const size_t q_end =
      l.q + (c.tensor ? fragment_bytes * (c.fp32_q ? 2 : 1) : c.heads * 128 * size_t{4});
  const size_t weights_end = l.weights + static_cast<size_t>(l.staged_heads) * 4;
  const size_t pages_end = l.pages + static_cast<size_t>(l.page_capacity) * 4;
  ASSERT_EQ(l.page_capacity, kIndexCachedPages);
  ASSERT_EQ(l.pages % 4, 0u);
  // Weights, queries and the page cache apart, all before the scores (all live while scoring).
  ASSERT_TRUE(weights_end <= l.q || q_end <= l.weights);
  ASSERT_TRUE(pages_end <= l.q || q_end <= l.pages);
  ASSERT_TRUE(pages_end <= l.weights || weights_end <= l.pages);
  ASSERT_LE(weights_end, l.scores);
  ASSERT_LE(pages_end, l.scores);
  ASSERT_EQ(l.q_lo, l.q + fragment_bytes);
  ASSERT_LE(q_end, l.scores);  // queries before scores (both live while scoring)
  // The first level of the select, counted while scoring, must not share bytes with anything
  // staging or scoring writes or reads.
  const size_t first_level = hdk::detail::select_layout(l.sort_capacity).histogram;
  const size_t first_level_end = first_level + hdk::detail::kSelectBins * size_t{4};
  auto apart = [&](size_t begin, size_t end) {
    return end <= first_level || begin >= first_level_end;
  };
  if (l.count_first_level) {
    ASSERT_TRUE(apart(l.q, q_end));
    ASSERT_TRUE(apart(l.weights, weights_end));
    ASSERT_TRUE(apart(l.pages, pages_end));
    ASSERT_TRUE(apart(l.scores, l.scores + static_cast<size_t>(l.chunk) * 4));
  }
  const int64_t per_cta = (c.capacity + C - 1) / C;
  if (l.overlay) {
    // Every row is scored once, before the select: all of its scores must be resident.
    ASSERT_GE(l.chunk, per_cta);
    ASSERT_GE(l.scores, select_end);  // the scores outlive the weights and queries
  } else {
    // Rescoring during the select: weights, queries and pages must not share its space.
    ASSERT_GE(l.weights, select_end);
    ASSERT_GE(l.pages, select_end);
    ASSERT_EQ(C, kIndexMaxCluster);
    ASSERT_GE(l.chunk, kIndexMinChunk);
  }
}

TEST(IndexLaunchPlan, RegionsFitAndDoNotOverlap) {
  for (int64_t rows : {1, 7, 64, 1000}) {
    for (int64_t heads : {1, 17, 64, 128}) {
      for (int64_t capacity : {0, 1, 100, 4096, 65536, 131072 + 5, 262144, 262144 + 64, 1 << 21}) {
        for (int64_t top_k : {1, 512, 2048}) {
          for (bool tensor : {true, false}) {
            for (bool fp32_q : {false, true}) {
              for (int shared : {kH100Shared, 101376}) {  // H100/H200, and a smaller device
                check_plan(Call{rows, heads, capacity, top_k, tensor, fp32_q, kH100Sms, shared});
              }
            }
          }
        }
      }
    }
  }
}

// The contract's shapes keep every score in shared memory on an H100: H = 64, up to 262144
// entries, both query dtypes and both scoring paths.
TEST(IndexLaunchPlan, ContractShapesStayResident) {
  for (int64_t capacity : {4096, 65536, 262144}) {
    for (bool tensor : {true, false}) {
      for (bool fp32_q : {false, true}) {
        const IndexLaunchPlan plan =
            plan_index_launch(64, 64, capacity, 2048, tensor, fp32_q, kH100Sms, kH100Shared);
        EXPECT_TRUE(plan.launch.overlay) << capacity << " " << tensor << " " << fp32_q;
        EXPECT_GE(plan.launch.chunk * plan.cluster_size, capacity);
      }
    }
  }
  // bf16 queries count the select's first level while scoring at either top_k; fp32 queries
  // (32 KiB) reach its histogram at a sort capacity of 512, and leave it to the select.
  EXPECT_TRUE(plan_index_launch(64, 64, 65536, 512, true, false, kH100Sms, kH100Shared)
                  .launch.count_first_level);
  EXPECT_TRUE(plan_index_launch(64, 64, 65536, 1024, true, false, kH100Sms, kH100Shared)
                  .launch.count_first_level);
  EXPECT_FALSE(plan_index_launch(64, 64, 65536, 512, true, true, kH100Sms, kH100Shared)
                   .launch.count_first_level);
  // 64 rows of 65536: two CTAs a row, one wave of 128 CTAs on 132 SMs.
  EXPECT_EQ(plan_index_launch(64, 64, 65536, 512, true, false, kH100Sms, kH100Shared).cluster_size,
            2);
  // One row spreads over 8 SMs.
  EXPECT_EQ(plan_index_launch(1, 64, 65536, 512, true, false, kH100Sms, kH100Shared).cluster_size,
            8);
  // A short row spreads too, down to 1024 entries a CTA.
  EXPECT_EQ(plan_index_launch(1, 64, 8192, 512, true, false, kH100Sms, kH100Shared).cluster_size,
            8);
  EXPECT_EQ(plan_index_launch(1, 64, 2048, 512, true, false, kH100Sms, kH100Shared).cluster_size,
            2);
  // Spreading keeps every row's cluster resident at once, with clusters of any size: on an H100
  // (cudaOccupancyMaxActiveClusters of the index kernels, 2026-11-27: 66, 39, 30, 22, 17, 15, 15
  // clusters of 2..8 CTAs), 16 rows get clusters of 6 (7 and 8 run 15 at once), 39 rows clusters
  // of 3, 40 and 64 rows clusters of 2.
  hdk::detail::ResidentClusterCounts clusters;
  const int h100[] = {0, 0, 66, 39, 30, 22, 17, 15, 15};
  for (int size = 2; size <= 8; ++size)
    clusters.by_size[size] = h100[size];
  auto on_h100 = [&](int64_t rows, int64_t capacity) {
    return plan_index_launch(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared, clusters)
        .cluster_size;
  };
  EXPECT_EQ(on_h100(16, 65536), 6);
  EXPECT_EQ(on_h100(16, 8192), 6);
  EXPECT_EQ(on_h100(15, 65536), 8);
  EXPECT_EQ(on_h100(39, 65536), 3);
  EXPECT_EQ(on_h100(40, 65536), 2);  // 39 clusters of 3 at once
  EXPECT_EQ(on_h100(64, 65536), 2);
  EXPECT_EQ(on_h100(16, 262144), 8);  // the scores need 8 CTAs; 16 is not run here
  // Where the device also runs clusters of 9..16 (an H100: 9 of 9, 7 of 10..16), rows whose
  // scores need 8 CTAs and that take waves of them weigh wider clusters by waves x (entries a
  // CTA + the fixed cost).
  for (int size = 9; size <= 16; ++size)
    clusters.by_size[size] = size == 9 ? 9 : 7;
  EXPECT_EQ(on_h100(16, 262144), 16);  // 3 x (16384 + 4096) against 2 x (32768 + 4096)
  EXPECT_EQ(on_h100(20, 262144), 16);  // the same waves
  EXPECT_EQ(on_h100(24, 262144), 8);   // 4 x 20480 against 2 x 36864
  EXPECT_EQ(on_h100(64, 262144), 8);   // 10 x 20480 against 5 x 36864
  EXPECT_EQ(on_h100(15, 262144), 8);   // one wave
  EXPECT_EQ(on_h100(16, 65536), 6);    // one wave: nothing to weigh
  EXPECT_EQ(on_h100(4, 65536), 16);
  // resident_clusters also counts clusters of one CTA (132 on an H100); a row's lone CTA is never
  // limited, so the count changes no plan (weighed as waves, 133 rows of 32768 entries would
  // take clusters of 2: 3 x (16384 + 4096) against 2 x (32768 + 4096)).
  EXPECT_EQ(on_h100(133, 32768), 1);
  clusters.by_size[1] = 132;
  EXPECT_EQ(on_h100(133, 32768), 1);
  EXPECT_EQ(on_h100(16, 262144), 16);
  EXPECT_EQ(on_h100(64, 65536), 2);
  // With only the powers of two known to run (the rest 0, unknown), the largest that fits.
  hdk::detail::ResidentClusterCounts powers;
  powers.by_size[2] = 64, powers.by_size[4] = 30, powers.by_size[8] = 14;
  EXPECT_EQ(plan_index_launch(16, 64, 65536, 512, true, false, kH100Sms, kH100Shared, powers)
                .cluster_size,
            7);
  EXPECT_EQ(plan_index_launch(16, 64, 65536, 512, true, false, kH100Sms, kH100Shared).cluster_size,
            8);
  // Beyond 8 x 32768 the plan rescored chunks.
  EXPECT_FALSE(
      plan_index_launch(64, 64, 300000, 512, true, false, kH100Sms, kH100Shared).launch.overlay);
}

// Where the device runs clusters of 16 (a non-portable size), few long rows spread over 16 SMs
// each, as long as every row's cluster runs at once and a CTA keeps 1024+ entries; such a
// cluster holds rows beyond 8 x 32768 entries without rescoring.
TEST(IndexLaunchPlan, WideClustersSpreadFewRows) {
  hdk::detail::ResidentClusterCounts wide;  // a device that runs 7 clusters of 16 at once
  wide.by_size[2] = 64, wide.by_size[4] = 30, wide.by_size[8] = 14, wide.by_size[16] = 7;
  auto plan = [&](int64_t rows, int64_t capacity) {
    return plan_index_launch(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared, wide);
  };
  EXPECT_EQ(plan(1, 65536).cluster_size, 16);
  EXPECT_EQ(plan(4, 65536).cluster_size, 16);
  EXPECT_EQ(plan(8, 65536).cluster_size, 8);   // 8 clusters of 16 would not run at once
  EXPECT_EQ(plan(1, 16384).cluster_size, 16);  // 1024 entries a CTA
  EXPECT_EQ(plan(1, 8192).cluster_size, 8);
  EXPECT_EQ(plan(2, 300007).cluster_size, 16);
  EXPECT_TRUE(plan(2, 300007).launch.overlay);
  EXPECT_GE(plan(2, 300007).launch.chunk * 16, 300007);
  EXPECT_EQ(plan(9, 300007).cluster_size, 8);  // 9 x 8 x 2 CTAs exceed the SMs
  EXPECT_FALSE(plan(9, 300007).launch.overlay);
  // Sizes between 8 and 16 where the device runs them: 2 rows of 20000 entries in clusters of
  // 16 would keep 1250 entries a CTA; 2 rows of 15000 stop at 14 (1072 a CTA).
  for (int size = 9; size <= 15; ++size)
    wide.by_size[size] = 7;
  EXPECT_EQ(plan(2, 20000).cluster_size, 16);
  EXPECT_EQ(plan(2, 15000).cluster_size, 14);
  // Without clusters of 16 nothing above 8.
  wide.by_size[16] = 0;
  EXPECT_EQ(plan(1, 65536).cluster_size, 8);
}

TEST(IndexLaunchPlan, TooManyHeadsIsAnError) {
  EXPECT_THROW(plan_index_launch(1, 4096, 1 << 20, 512, true, true, kH100Sms, kH100Shared), Error);
  EXPECT_THROW(plan_index_launch(1, 4096, 1 << 20, 512, false, false, kH100Sms, kH100Shared),
               Error);
}

// ---- Scoring over every SM through the workspace ------------------------------------------

// The workspace plan of a call that the one-launch plan accepts: used only for few rows whose
// clusters leave most SMs idle, one wave of scoring CTAs that outnumber the cluster's, shares of
// whole tiles that cover the row, regions of the scoring and select kernels that fit.
void check_workspace_plan(const Call& c, const hdk::detail::ResidentClusterCounts& clusters) {
  SCOPED_TRACE(c.describe());
  IndexLaunchPlan cluster;
  try {
    cluster = plan_index_launch(c.rows, c.heads, c.capacity, c.top_k, c.tensor, c.fp32_q, c.sms,
                                c.shared, clusters);
  } catch (const Error&) {
    return;  // check_plan covers the refusal
  }
  const IndexWorkspacePlan plan =
      plan_index_workspace(c.rows, c.heads, c.capacity, c.top_k, c.tensor, c.fp32_q, c.sms,
                           c.shared, cluster, clusters, c.key_ring, ring_rows_of(c));
  const int64_t tiles = (c.capacity + kIndexScoreMinEntries - 1) / kIndexScoreMinEntries;
  if (c.key_ring > 0 && c.capacity > 0 && index_rows_stream(c.rows, c.capacity, ring_rows_of(c))) {
    // Streamed keys: every row through the workspace, up to kIndexMaxWorkspaceRows a launch
    // (kIndexStreamRowsPerLaunch with whole pages), in CTAs of at least kIndexScoreMinEntries that
    // keep two on every SM; the workspace holds a launch's rows.
    ASSERT_EQ(plan.rows_per_launch,
              std::min<int64_t>(
                  c.rows, c.whole_pages ? kIndexStreamRowsPerLaunch : kIndexMaxWorkspaceRows));
    ASSERT_EQ(plan.segments,
              std::min<int64_t>(tiles, std::max<int64_t>(1, 2 * c.sms / plan.rows_per_launch)));
    ASSERT_GE(plan.segments, 1);
  } else {
    const bool idle = std::min<int64_t>(c.rows * cluster.cluster_size, c.sms) * 2 <= c.sms;
    if (c.rows > kIndexMaxWorkspaceRows || c.capacity == 0 || !idle) {
      ASSERT_EQ(plan.segments, 0);
      return;
    }
    if (plan.segments == 0) {
      // Only where CTAs of kIndexWorkspaceMinEntries would be no more than the cluster's.
      ASSERT_LE(std::min<int64_t>(c.sms / c.rows, (c.capacity + kIndexWorkspaceMinEntries - 1) /
                                                      kIndexWorkspaceMinEntries),
                cluster.cluster_size);
      return;
    }
    ASSERT_GT(plan.segments, cluster.cluster_size);
    // As many CTAs as fit the SMs, of at least kIndexScoreMinEntries each.
    ASSERT_EQ(plan.segments, std::min<int64_t>(c.sms / c.rows, tiles));
    ASSERT_LE(plan.segments * c.rows, c.sms);  // one wave, one CTA an SM
    ASSERT_EQ(plan.rows_per_launch, c.rows);
  }
  // Every entry of any row up to the capacity in exactly one share of whole 64-entry tiles.
  for (int64_t length : {int64_t{0}, int64_t{1}, c.capacity / 3, c.capacity - 1, c.capacity}) {
    const int64_t share = index_score_segment(length, plan.segments);
    ASSERT_EQ(share % 64, 0);
    ASSERT_GE(share * plan.segments, length);
  }
  const IndexLaunch& s = plan.score;
  ASSERT_EQ(s.q, 0u);  // on the 1024-byte boundary, for wgmma's swizzle
  ASSERT_EQ(s.staged_heads, cluster.launch.staged_heads);
  ASSERT_EQ(s.m_tiles, cluster.launch.m_tiles);
  ASSERT_EQ(s.page_capacity, cluster.launch.page_capacity);
  const size_t fragment_bytes = static_cast<size_t>(s.staged_heads) * 128 * 2;
  ASSERT_EQ(s.q_lo, fragment_bytes);
  const size_t q_end = c.tensor ? fragment_bytes * (c.fp32_q ? 2 : 1) : c.heads * 128 * size_t{4};
  ASSERT_GE(s.weights, q_end);
  ASSERT_EQ(s.weights % 16, 0u);
  ASSERT_GE(s.pages, s.weights + static_cast<size_t>(s.staged_heads) * 4);
  ASSERT_EQ(s.pages % 16, 0u);
  const size_t pages_end = s.pages + static_cast<size_t>(s.page_capacity) * 4;
  ASSERT_EQ(s.key_ring_bytes, c.key_ring);
  if (c.key_ring > 0) {  // the key ring after the staged data, on a boundary of its own
    ASSERT_EQ(s.key_ring % 1024, 0u);
    ASSERT_GE(s.key_ring, pages_end);
    ASSERT_LT(s.key_ring, pages_end + 1024);
    ASSERT_EQ(s.bytes, s.key_ring + c.key_ring + 1024);
    // Two CTAs an SM.
    ASSERT_LE(2 * s.bytes, static_cast<size_t>(c.shared));
  } else {
    ASSERT_EQ(s.bytes, pages_end + 1024);
  }
  ASSERT_LE(s.bytes, static_cast<size_t>(c.shared));
  // The select: the one-launch plan's sizes, its first level counted while it loads the keys.
  const IndexLaunch& l = plan.select.launch;
  ASSERT_TRUE(l.count_first_level);
  ASSERT_LE(l.bytes, static_cast<size_t>(c.shared));
  ASSERT_GE(l.sort_capacity, std::min<int64_t>(c.top_k, c.capacity));
  const int C = plan.select.cluster_size;
  ASSERT_TRUE(C >= 1 && C <= clusters.largest());
  if (c.key_ring == 0) {
    ASSERT_LE(c.rows * C, c.sms);
  }
  const size_t histogram = hdk::detail::select_layout(l.sort_capacity).histogram;
  ASSERT_TRUE(l.scores >= histogram + hdk::detail::kSelectBins * size_t{4} ||
              l.scores + static_cast<size_t>(l.chunk) * 4 <= histogram);
  if (l.overlay) {
    ASSERT_GE(l.chunk * C, c.capacity);
  }
  // A CTA a row where the rule allows it (the grid's top_k leave room for a whole row): the
  // cluster of 1 holds every key of the row.
  ASSERT_EQ(plan.select_in_one_cta, index_select_in_one_cta(c.capacity));
  if (plan.select_in_one_cta) {
    ASSERT_LE(c.capacity, kIndexCtaSelectMaxEntries);
    ASSERT_EQ(C, 1);
    ASSERT_GE(l.chunk, c.capacity);
    // The row's keys are copied and read in 16-byte pieces.
    ASSERT_EQ(l.scores % 16, 0u);
    ASSERT_EQ(l.chunk % 4, 0);
  }
  // The keys of every row and a flag for each of a row's scoring CTAs, within what
  // index_topk_workspace_bytes promises. The workspace holds a launch's rows (up to
  // kIndexStreamRowsPerLaunch, whichever the launch takes).
  const int64_t rows = plan.layout.rows;
  ASSERT_GE(rows, plan.rows_per_launch);
  ASSERT_EQ(rows, std::min<int64_t>(c.rows, kIndexStreamRowsPerLaunch));
  ASSERT_GE(plan.layout.row_stride, c.capacity);
  ASSERT_GE(index_flag_stride(plan.layout), plan.segments);
  ASSERT_EQ(index_flag_stride(plan.layout),
            (c.capacity + kIndexScoreMinEntries - 1) / kIndexScoreMinEntries);
  ASSERT_GE(plan.layout.flags_offset, plan.layout.keys_offset + rows * plan.layout.row_stride * 4);
  ASSERT_GE(plan.layout.bytes,
            plan.layout.flags_offset + rows * index_flag_stride(plan.layout) * 4);
  ASSERT_EQ(plan.layout.bytes, index_workspace_layout(c.rows, c.capacity).bytes);
}

TEST(IndexWorkspacePlan, RegionsFitAndFewRowsFillTheSms) {
  hdk::detail::ResidentClusterCounts h100;  // with clusters of 9..16 (9 of 9, 7 of 10..16)
  const int sizes[] = {132, 132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7};
  for (int size = 1; size <= 16; ++size)
    h100.by_size[size] = sizes[size];
  for (const hdk::detail::ResidentClusterCounts& clusters :
       {hdk::detail::ResidentClusterCounts(), h100}) {
    for (int64_t rows : {1, 2, 3, 4, 7, 8, 16, 64, 65, 1000}) {
      for (int64_t heads : {1, 17, 64, 128}) {
        for (int64_t capacity : {0, 1, 100, 1000, 4096, 16384, 65536, 262144 + 64, 1 << 21}) {
          for (int64_t top_k : {1, 512, 2048}) {
            for (bool tensor : {true, false}) {
              for (bool fp32_q : {false, true}) {
                for (int sms : {kH100Sms, 78}) {
                  // The key ring goes with E4M3 q, planned as bf16 tensor-core queries, its
                  // tiles copied as whole pages or not.
                  for (size_t ring : {size_t{0}, kE4m3Ring}) {
                    if (ring > 0 && (!tensor || fp32_q)) continue;
                    for (bool whole_pages : {false, true}) {
                      if (ring == 0 && whole_pages) continue;
                      check_workspace_plan(Call{rows, heads, capacity, top_k, tensor, fp32_q, sms,
                                                kH100Shared, ring, whole_pages},
                                           clusters);
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// The issue's shapes on an H100 that runs clusters of 16: one row of 16384 entries in 128 CTAs of
// 128 (its cluster: 16), of 65536 over all 132 SMs; 4 rows in 33 CTAs each; from 8 rows of 16384
// (clusters of 16 on 128 SMs) and 16 rows of 65536 (clusters of 6 on 96) the one-launch plan.
TEST(IndexWorkspacePlan, IssueShapesOnAnH100) {
  hdk::detail::ResidentClusterCounts h100;
  const int sizes[] = {132, 132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7};
  for (int size = 1; size <= 16; ++size)
    h100.by_size[size] = sizes[size];
  auto segments = [&](int64_t rows, int64_t capacity) {
    const IndexLaunchPlan cluster =
        plan_index_launch(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared, h100);
    return plan_index_workspace(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared,
                                cluster, h100)
        .segments;
  };
  EXPECT_EQ(segments(1, 16384), 128);
  EXPECT_EQ(segments(1, 65536), 132);
  EXPECT_EQ(segments(1, 262144), 132);
  EXPECT_EQ(segments(4, 16384), 33);
  EXPECT_EQ(segments(4, 65536), 33);
  EXPECT_EQ(segments(8, 16384), 0);
  EXPECT_EQ(segments(16, 65536), 0);
  EXPECT_EQ(segments(64, 16384), 0);
  EXPECT_EQ(segments(1, 2048), 16);  // 16 CTAs of 128 against a cluster of 2
  EXPECT_EQ(segments(1, 512), 4);    // 2 CTAs of 256 outnumber a cluster of 1: 4 of 128
  EXPECT_EQ(segments(1, 256), 0);    // one CTA either way
}

// E4M3 keys streamed through the key ring: rows through the workspace where index_rows_stream
// says so, two CTAs an SM, 64 rows a launch.
TEST(IndexWorkspacePlan, E4m3RowsStreamThroughTheWorkspace) {
  auto plan = [&](int64_t rows, int64_t capacity) {
    const IndexLaunchPlan cluster =
        plan_index_launch(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared);
    return plan_index_workspace(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared,
                                cluster, hdk::detail::ResidentClusterCounts(), kE4m3Ring);
  };
  EXPECT_EQ(plan(1, 65536).segments, 264);
  EXPECT_EQ(plan(1, 16384).segments, 128);  // CTAs of 128 entries at least
  EXPECT_EQ(plan(8, 65536).segments, 33);
  EXPECT_EQ(plan(32, 2048).segments, 8);
  EXPECT_EQ(plan(64, 65536).segments, 4);
  EXPECT_EQ(plan(64, 65536).rows_per_launch, 64);
  EXPECT_EQ(plan(128, 65536).segments, 4);
  EXPECT_EQ(plan(128, 65536).rows_per_launch, 64);
  EXPECT_EQ(plan(5, 65536).rows_per_launch, 5);
  // Where the one launch is faster: many rows of few entries.
  EXPECT_EQ(plan(64, 2048).segments, 0);
  EXPECT_EQ(plan(128, 16384).segments, 0);
  EXPECT_FALSE(index_rows_stream(65, 16384, IndexRingRows::kByLength));
  EXPECT_TRUE(index_rows_stream(65, 65536, IndexRingRows::kByLength));
  EXPECT_TRUE(index_rows_stream(32, 1, IndexRingRows::kByLength));
  EXPECT_FALSE(index_rows_stream(33, 2048, IndexRingRows::kByLength));
  // Tiles copied as whole pages: every row streams, 128 rows a launch.
  EXPECT_TRUE(index_rows_stream(64, 2048, IndexRingRows::kEvery));
  EXPECT_TRUE(index_rows_stream(128, 2048, IndexRingRows::kEvery));
  EXPECT_TRUE(index_rows_stream(1000, 1, IndexRingRows::kEvery));
  auto whole = [&](int64_t rows, int64_t capacity) {
    const IndexLaunchPlan cluster =
        plan_index_launch(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared);
    return plan_index_workspace(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared,
                                cluster, hdk::detail::ResidentClusterCounts(), kE4m3Ring,
                                IndexRingRows::kEvery);
  };
  EXPECT_EQ(whole(128, 16384).rows_per_launch, 128);
  EXPECT_EQ(whole(128, 16384).segments, 2);
  EXPECT_EQ(whole(128, 16384).layout.rows, 128);
  EXPECT_EQ(whole(96, 2048).rows_per_launch, 96);
  EXPECT_EQ(whole(96, 2048).segments, 2);
  EXPECT_EQ(whole(300, 65536).rows_per_launch, 128);
  EXPECT_EQ(whole(64, 65536).segments, 4);
}

// Which rings copy their tiles as whole pages: E4M3 keys and the packed MXFP4 q, in 16-byte
// aligned pages of a multiple of 64 entries; the exact q's MXFP4 tiles never.
TEST(IndexWorkspacePlan, WholePageTilesNeedAlignedPagesOfSixtyFourEntries) {
  for (IndexQueryForm form : {IndexQueryForm::kE4M3, IndexQueryForm::kMXFP4}) {
    EXPECT_TRUE(index_key_ring_whole_pages(form, true, 64));
    EXPECT_TRUE(index_key_ring_whole_pages(form, true, 128));
    EXPECT_FALSE(index_key_ring_whole_pages(form, false, 64));
    EXPECT_FALSE(index_key_ring_whole_pages(form, true, 16));
    EXPECT_FALSE(index_key_ring_whole_pages(form, true, 96));
  }
  EXPECT_FALSE(index_key_ring_whole_pages(IndexQueryForm::kExact, true, 64));
  // The scoring kernel settles the form at compile time by the same predicate.
  static_assert(index_form_takes_whole_pages(IndexQueryForm::kE4M3), "E4M3 keys");
  static_assert(index_form_takes_whole_pages(IndexQueryForm::kMXFP4), "the packed q");
  static_assert(!index_form_takes_whole_pages(IndexQueryForm::kExact), "the exact q");
}

// The select of a row through the workspace runs in one CTA up to 16384 keys (the measured
// shapes), whether or not its keys stream through the key ring; clusters beyond.
TEST(IndexWorkspacePlan, ShortRowsSelectInOneCta) {
  auto alone = [&](int64_t rows, int64_t capacity, size_t ring) {
    const IndexLaunchPlan cluster =
        plan_index_launch(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared);
    const IndexWorkspacePlan plan =
        plan_index_workspace(rows, 64, capacity, 512, true, false, kH100Sms, kH100Shared, cluster,
                             hdk::detail::ResidentClusterCounts(), ring);
    EXPECT_GT(plan.segments, 0);
    return plan.select_in_one_cta;
  };
  for (size_t ring : {size_t{0}, kE4m3Ring}) {
    EXPECT_TRUE(alone(1, 2048, ring));
    EXPECT_TRUE(alone(4, 8192, ring));
    EXPECT_TRUE(alone(16, 2048, ring));
    EXPECT_FALSE(alone(1, 16384 + 64, ring));
    EXPECT_FALSE(alone(2, 65536, ring));
  }
  EXPECT_TRUE(alone(1, 16384, 0));
  EXPECT_TRUE(alone(4, 16384, 0));
  EXPECT_TRUE(alone(1, 16384, kE4m3Ring));
  EXPECT_TRUE(alone(4, 16384, kE4m3Ring));
  EXPECT_TRUE(alone(8, 16384, kE4m3Ring));
  EXPECT_TRUE(alone(64, 16384, kE4m3Ring));
  EXPECT_FALSE(alone(1, 32768, kE4m3Ring));
  EXPECT_FALSE(alone(4, 32768, 0));
}

// MXFP4 keys with the packed query take the key ring for rows of 16384 entries and more, from 8
// rows or from 262144 keys in all: where a scoring CTA gets few tiles, the register-fed kernels
// were faster.
TEST(IndexWorkspacePlan, Mxfp4KeysTakeTheRingWhereItMeasuredFaster) {
  EXPECT_FALSE(index_mxfp4_ring_pays(1, 65536));
  EXPECT_FALSE(index_mxfp4_ring_pays(2, 65536));
  EXPECT_FALSE(index_mxfp4_ring_pays(4, 16384));
  EXPECT_FALSE(index_mxfp4_ring_pays(7, 32768));
  EXPECT_FALSE(index_mxfp4_ring_pays(16, 2048));
  EXPECT_FALSE(index_mxfp4_ring_pays(128, 16383));
  EXPECT_TRUE(index_mxfp4_ring_pays(8, 16384));
  EXPECT_TRUE(index_mxfp4_ring_pays(4, 65536));
  EXPECT_TRUE(index_mxfp4_ring_pays(1, 262144));
}

// Each ring holds its warpgroups' stages of codes, then their scales, then 8-byte aligned
// barriers, one a stage (its tiles copied as whole pages complete on them).
TEST(IndexWorkspacePlan, KeyRingsHoldTheirTilesScalesAndBarriers) {
  for (int warpgroups : {1, 2}) {
    const int stages = warpgroups * kFp8KeyStages;
    EXPECT_EQ(fp8_key_ring_barriers(warpgroups), stages * (kFp8KeyTileBytes + 256));
    EXPECT_EQ(fp8_key_ring_bytes(warpgroups), fp8_key_ring_barriers(warpgroups) + stages * 8);
    EXPECT_EQ(fp8_key_ring_barriers(warpgroups) % 8, 0);
    EXPECT_EQ(mxfp4_key_ring_barriers(warpgroups), stages * (kMxfp4KeyTileBytes + 256));
    EXPECT_EQ(mxfp4_key_ring_bytes(warpgroups), mxfp4_key_ring_barriers(warpgroups) + stages * 8);
    EXPECT_EQ(mxfp4_key_ring_barriers(warpgroups) % 8, 0);
  }
}

// The scoring kernel's key ring follows the query form and the path: E4M3 keys and the exact q
// over MXFP4 keys on the warpgroup kernel always stream, the packed MXFP4 q where
// index_mxfp4_ring_pays, NVFP4 keys and the exact q on the warp kernel or CUDA cores never.
TEST(IndexWorkspacePlan, KeyRingForEachQueryForm) {
  const size_t e4m3 = static_cast<size_t>(fp8_key_ring_bytes(2));
  const size_t mxfp4 = static_cast<size_t>(mxfp4_key_ring_bytes(2));
  EXPECT_LT(mxfp4, e4m3);  // 64 bytes of codes an entry, not 128
  for (int64_t rows : {1, 8, 128}) {
    for (int64_t capacity : {2048, 16384, 262144}) {
      const size_t mxfp4_if_pays = index_mxfp4_ring_pays(rows, capacity) ? mxfp4 : 0u;
      for (bool exact_mxfp4_warpgroup : {false, true}) {
        EXPECT_EQ(index_key_ring_bytes(IndexQueryForm::kE4M3, true, exact_mxfp4_warpgroup, rows,
                                       capacity, 2),
                  e4m3);
        EXPECT_EQ(index_key_ring_bytes(IndexQueryForm::kMXFP4, true, exact_mxfp4_warpgroup, rows,
                                       capacity, 2),
                  mxfp4_if_pays);
        EXPECT_EQ(index_key_ring_bytes(IndexQueryForm::kExact, true, exact_mxfp4_warpgroup, rows,
                                       capacity, 2),
                  exact_mxfp4_warpgroup ? mxfp4 : 0u);
        for (IndexQueryForm form :
             {IndexQueryForm::kE4M3, IndexQueryForm::kMXFP4, IndexQueryForm::kExact}) {
          EXPECT_FALSE(index_form_has_key_ring(form, false, exact_mxfp4_warpgroup));
          EXPECT_EQ(index_key_ring_bytes(form, false, exact_mxfp4_warpgroup, rows, capacity, 2), 0u)
              << "CUDA cores";
        }
      }
    }
  }
  EXPECT_EQ(index_key_ring_bytes(IndexQueryForm::kMXFP4, true, false, 8, 16384, 2), mxfp4);
  EXPECT_EQ(index_key_ring_bytes(IndexQueryForm::kExact, true, true, 1, 2048, 2), mxfp4);
  EXPECT_EQ(index_key_ring_bytes(IndexQueryForm::kExact, true, false, 8, 16384, 2), 0u);
  EXPECT_EQ(index_key_ring_bytes(IndexQueryForm::kMXFP4, true, false, 1, 65536, 2), 0u);
}

// Every row streams, kIndexStreamRowsPerLaunch rows a launch, for E4M3 tiles copied as whole
// pages, for the exact q over MXFP4 keys on the warpgroup kernel and for the packed MXFP4 q
// wherever its ring is on; other E4M3 rows by index_rows_stream's sizes.
TEST(IndexWorkspacePlan, EveryRowStreamsForWholePagesAndTheMxfp4Forms) {
  EXPECT_EQ(index_ring_rows(IndexQueryForm::kE4M3, true, 64, false), IndexRingRows::kEvery);
  EXPECT_EQ(index_ring_rows(IndexQueryForm::kE4M3, true, 48, false), IndexRingRows::kByLength);
  EXPECT_EQ(index_ring_rows(IndexQueryForm::kE4M3, false, 64, false), IndexRingRows::kByLength);
  EXPECT_EQ(index_ring_rows(IndexQueryForm::kExact, false, 3, true), IndexRingRows::kEvery);
  EXPECT_EQ(index_ring_rows(IndexQueryForm::kExact, true, 64, false), IndexRingRows::kByLength);
  EXPECT_EQ(index_ring_rows(IndexQueryForm::kMXFP4, true, 64, false), IndexRingRows::kEvery);
  EXPECT_EQ(index_ring_rows(IndexQueryForm::kMXFP4, false, 3, false), IndexRingRows::kEvery);
  const size_t ring = static_cast<size_t>(mxfp4_key_ring_bytes(2));
  auto plan = [&](int64_t rows, int64_t capacity, IndexRingRows ring_rows) {
    const IndexLaunchPlan cluster =
        plan_index_launch(rows, 64, capacity, 512, true, false, 132, 232448);
    return plan_index_workspace(rows, 64, capacity, 512, true, false, 132, 232448, cluster,
                                hdk::detail::ResidentClusterCounts(), ring, ring_rows);
  };
  // 128 rows of 2048 entries, which stream only where every row does: one launch, 2 scoring
  // CTAs a row on 132 SMs.
  EXPECT_EQ(plan(128, 2048, IndexRingRows::kEvery).rows_per_launch, 128);
  EXPECT_EQ(plan(128, 2048, IndexRingRows::kEvery).segments, 2);
  EXPECT_EQ(plan(128, 2048, IndexRingRows::kByLength).segments, 0);
  // The packed q's rows of 16384 entries, which the E4M3 rule by sizes keeps in the one launch
  // beyond 64 rows: every row streams, 128 a launch.
  EXPECT_EQ(plan(128, 16384, IndexRingRows::kByLength).segments, 0);
  EXPECT_EQ(plan(128, 16384, IndexRingRows::kEvery).rows_per_launch, 128);
  EXPECT_EQ(plan(128, 16384, IndexRingRows::kEvery).segments, 2);
  EXPECT_EQ(plan(96, 16384, IndexRingRows::kEvery).rows_per_launch, 96);
  EXPECT_EQ(plan(96, 16384, IndexRingRows::kEvery).segments, 2);
  EXPECT_EQ(plan(300, 65536, IndexRingRows::kEvery).rows_per_launch, 128);
  EXPECT_EQ(plan(8, 65536, IndexRingRows::kEvery).rows_per_launch, 8);
}

// The key ring a call gets: the plan's (kAuto), or the comparison aid's forced choice for the
// MXFP4 forms (E4M3 keys keep the plan's whatever the choice).
TEST(IndexWorkspacePlan, KeyRingFollowsThePlanOrTheForcedChoice) {
  const size_t e4m3 = static_cast<size_t>(fp8_key_ring_bytes(2));
  const size_t mxfp4 = static_cast<size_t>(mxfp4_key_ring_bytes(2));
  using Choice = IndexKeyRingChoice;
  // (form, tensor, exact_mxfp4_warpgroup, wide, block_size, rows, capacity)
  auto ring = [](IndexQueryForm form, bool tensor, bool exact, bool wide, int64_t rows,
                 int64_t capacity, Choice choice) {
    return index_key_ring(form, tensor, exact, wide, 64, rows, capacity, 2, choice);
  };
  for (Choice choice : {Choice::kAuto, Choice::kNever, Choice::kAlways}) {
    const IndexKeyRing fp8 = ring(IndexQueryForm::kE4M3, true, false, true, 1, 2048, choice);
    EXPECT_EQ(fp8.bytes, e4m3);
    EXPECT_EQ(fp8.rows, IndexRingRows::kEvery);
    const IndexKeyRing fp8_narrow =
        ring(IndexQueryForm::kE4M3, true, false, false, 1, 2048, choice);
    EXPECT_EQ(fp8_narrow.bytes, e4m3);
    EXPECT_EQ(fp8_narrow.rows, IndexRingRows::kByLength);
  }
  // The plan: the packed q's ring only where it pays, the exact q's on the warpgroup kernel.
  for (int64_t rows : {1, 8, 128}) {
    for (int64_t capacity : {2048, 16384, 65536}) {
      for (bool tensor : {false, true}) {
        for (IndexQueryForm form : {IndexQueryForm::kExact, IndexQueryForm::kMXFP4}) {
          const bool exact = form == IndexQueryForm::kExact && tensor;
          const IndexKeyRing planned =
              ring(form, tensor, exact, true, rows, capacity, Choice::kAuto);
          EXPECT_EQ(planned.bytes, index_key_ring_bytes(form, tensor, exact, rows, capacity, 2));
          EXPECT_EQ(planned.rows, index_ring_rows(form, true, 64, exact));
          const IndexKeyRing never =
              ring(form, tensor, exact, true, rows, capacity, Choice::kNever);
          EXPECT_EQ(never.bytes, 0u);
          EXPECT_EQ(never.rows, IndexRingRows::kByLength);
          const IndexKeyRing always =
              ring(form, tensor, exact, true, rows, capacity, Choice::kAlways);
          EXPECT_EQ(always.bytes, tensor ? mxfp4 : 0u) << rows << " x " << capacity;
          EXPECT_EQ(always.rows, tensor ? IndexRingRows::kEvery : IndexRingRows::kByLength);
        }
      }
    }
  }
  // Forced on where the plan would not take it: one packed row of 2048 entries.
  EXPECT_EQ(ring(IndexQueryForm::kMXFP4, true, false, true, 1, 2048, Choice::kAuto).bytes, 0u);
  EXPECT_EQ(ring(IndexQueryForm::kMXFP4, true, false, true, 1, 2048, Choice::kAlways).bytes, mxfp4);
}

// index_topk_workspace_bytes promises enough for every call up to its arguments.
TEST(IndexWorkspacePlan, WorkspaceBytesGrowWithRowsAndEntries) {
  for (int64_t rows = 1; rows <= 80; ++rows) {
    for (int64_t capacity : {1, 63, 64, 65, 16384, 65536, 262144}) {
      const int64_t bytes = index_workspace_layout(rows, capacity).bytes;
      EXPECT_GE(index_workspace_layout(rows + 1, capacity).bytes, bytes);
      EXPECT_GE(index_workspace_layout(rows, capacity + 1).bytes, bytes);
      EXPECT_EQ(bytes % 256, 0);
    }
  }
}

// The scoring kernel's share, from a FastDivide of the segment count, is the plan's for every
// length the kernel takes (up to 2^31 - 1) and any segment count: the CTAs it starts and the
// shares they score agree.
TEST(IndexWorkspacePlan, KernelShareByFastDivideIsThePlans) {
  const int64_t kMaxLength = (int64_t{1} << 31) - 1;
  for (int64_t segments : {1, 2, 3, 7, 64, 132, 264, 1000, 4095}) {
    const hdk::detail::FastDivide divide(static_cast<uint32_t>(segments));
    std::vector<int64_t> lengths = {
        0, 1, 63, 64, 65, segments - 1, segments, segments + 1, kMaxLength, kMaxLength - 1};
    for (int64_t length = 1; length < kMaxLength / 3; length = length * 3 + 1)
      lengths.push_back(length);
    for (int64_t length : lengths) {
      if (length < 0) continue;
      const int64_t kernel = index_score_tiles(divide.ceil_quotient(static_cast<uint32_t>(length)));
      ASSERT_EQ(kernel, index_score_segment(length, segments)) << length << " / " << segments;
      ASSERT_EQ(kernel, ((length + segments - 1) / segments + 63) / 64 * 64);
    }
  }
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
