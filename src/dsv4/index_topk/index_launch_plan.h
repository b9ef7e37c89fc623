// Host planning of index_topk's CUDA launch (cuda/index_topk_cuda.cu): CTAs per row (a cluster)
// and the kernel's shared-memory layout, and whether a few rows are scored over every SM through
// the caller's workspace instead. Plain C++ so that tests/dsv4/index_launch_plan_test.cpp checks
// it on the CPU: regions that must not overlap do not, everything fits the device's shared
// memory, and up to 8 x 32768 entries per row the scores stay resident.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/ceil_div.h"

#include "core/host_device.h"
#include "core/resident_clusters.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_mma_layout.h"
#include "dsv4/index_topk/index_wgmma_layout.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "topk/select_layout.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr int kIndexMaxCluster = hdk::detail::kPortableClusterSize;
constexpr int kIndexMaxSpreadCluster = hdk::detail::kMaxClusterSize;  // where the device runs it
constexpr int64_t kIndexMaxChunk = 32768;      // scores a CTA holds at once: 128 KiB
constexpr int64_t kIndexMinChunk = 1024;       // below this a CTA would rescore too often
constexpr int64_t kIndexSpreadEntries = 1024;  // fewest entries per CTA when spreading rows
// What a CTA costs besides its entries, in entry times, when rows take waves: a wave of clusters
// of 16 CTAs of 4096 entries took 75-79 us on an H100, of 16384 entries 196-205 us (a line
// through both: 32 us at 0 entries, about 3000 entry times); a wave of clusters of 8 CTAs of
// 32768 entries 347 us (7300 from the line through it and 16384's).
constexpr int64_t kIndexCtaFixedEntries = 4096;

// The kernel's shared memory (byte offsets from its first 1024-byte boundary; queries on such a
// boundary for wgmma's swizzle, the rest on 16 bytes) and sizes. Weights (staged_heads fp32) and
// queries (tensor cores: staged_heads x 128 bf16, hi then lo for fp32 q, as the warp kernel's
// fragment words or the warpgroup kernel's B tile; CUDA cores: H x 128 fp32) sit in the select's
// space when `overlay` (every row's scores resident, so scoring ends before the select starts),
// else after it.
struct IndexLaunch {
  int sort_capacity = 1;     // power of two >= the most winners a row can have
  int64_t m_tiles = 0;       // ceil(H / 16): the warp kernel's 16-head tiles
  int64_t staged_heads = 0;  // heads staged, padded with zero weights and queries
  int64_t chunk = 0;         // scores a CTA holds at once (a multiple of 32)
  bool overlay = false;
  size_t weights = 0;
  size_t q = 0;
  size_t q_lo = 0;
  size_t pages = 0;           // page_capacity int32 block ids of the CTA's segment
  int64_t page_capacity = 0;  // more pages than this are looked up in the block table
  size_t scores = 0;          // chunk uint32 keys
  // The workspace's FP8-form scoring kernel: its key ring (fp8_key_ring_bytes or
  // mxfp4_key_ring_bytes: tiles of codes, then their scales) on a 1024-byte boundary after the
  // staged data, and its size (0: none).
  size_t key_ring = 0;
  size_t key_ring_bytes = 0;
  size_t bytes = 0;  // dynamic shared memory, with the room to reach a 1024-byte boundary
  // The select's first-level histogram (select_layout's, buffer 0) lies apart from everything
  // staging and scoring use, so resident CTAs count it while they score.
  bool count_first_level = false;
};

// Up to 64 heads the tensor-core kernel scores a warpgroup's 64 entries per wgmma product
// (cuda/index_score_bf16.cuh); above, the warp kernel's mma.sync tiles of 16 heads.
inline bool warpgroup_scoring_fits(int64_t num_heads) {
  return num_heads <= kWarpgroupHeads;
}

constexpr size_t kIndexSharedAlignment = 1024;  // wgmma's 128-byte swizzle atom
// Block ids a CTA keeps in shared memory (4 KiB): a segment of 32768 entries in pages of 64 needs
// 513; smaller pages fall back to the block table.
constexpr int64_t kIndexCachedPages = 1024;

struct IndexLaunchPlan {
  IndexLaunch launch;
  int cluster_size = 1;  // CTAs per row: 1 to 16
};

inline size_t align16(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

// The next 1024-byte boundary (wgmma's swizzled operands start on one).
inline size_t align_to_boundary(size_t bytes) {
  return (bytes + kIndexSharedAlignment - 1) / kIndexSharedAlignment * kIndexSharedAlignment;
}

// The staged queries' bytes: bf16 staged_heads x 128 (the warp kernel's m_tiles x 8 steps x 32
// lanes x 16 bytes), twice for fp32 q (hi, then lo), on tensor cores; H x 128 fp32 on CUDA cores.
inline size_t index_fragment_bytes(int64_t staged_heads) {
  return static_cast<size_t>(staged_heads) * kIndexerKeyDim * 2;
}
inline size_t index_query_bytes(int64_t num_heads, int64_t staged_heads, bool tensor, bool fp32_q) {
  return tensor ? index_fragment_bytes(staged_heads) * (fp32_q ? 2 : 1)
                : static_cast<size_t>(num_heads) * static_cast<size_t>(kIndexerKeyDim) * 4;
}

// Sizes from the validated call (capacity = max_blocks * block_size) and the device (its SMs, its
// opt-in shared memory per CTA and the clusters of each size it runs at once, one CTA per SM).
// In `clusters`, 0 for a size of 2 to 8 CTAs means unknown, no limit (the default, for plans
// without a device); above 8, that the device does not run the size, and 16 decides whether any
// of them is used. Size 1 is never limited. `spread` false keeps a row in the fewest CTAs that
// hold its scores. Throws hdk::Error when the queries leave too little shared memory for scores.
inline IndexLaunchPlan plan_index_launch(
    int64_t num_rows, int64_t num_heads, int64_t capacity, int64_t top_k, bool tensor, bool fp32_q,
    int sm_count, int shared_limit,
    const hdk::detail::ResidentClusterCounts& clusters = hdk::detail::ResidentClusterCounts(),
    bool spread = true) {
  using hdk::detail::ceil_div;
  auto at = [&](int size) { return size <= 1 ? 0 : clusters.by_size[size]; };
  IndexLaunchPlan plan;
  IndexLaunch& launch = plan.launch;
  launch.sort_capacity = hdk::detail::select_sort_capacity(top_k, capacity);
  launch.m_tiles = ceil_div(num_heads, kMmaM);
  // Either tensor-core kernel can run the plan (tests force the warp kernel at any H).
  launch.staged_heads =
      tensor && warpgroup_scoring_fits(num_heads) ? kWarpgroupHeads : launch.m_tiles * kMmaM;
  const size_t fragment_bytes = index_fragment_bytes(launch.staged_heads);
  const size_t q_bytes = index_query_bytes(num_heads, launch.staged_heads, tensor, fp32_q);
  const size_t weight_bytes = align16(static_cast<size_t>(launch.staged_heads) * 4);
  const size_t select_bytes = align16(hdk::detail::select_layout(launch.sort_capacity).bytes);
  const int64_t usable = static_cast<int64_t>(shared_limit) - kIndexSharedAlignment;
  auto scores_room = [&](size_t scores_offset) {  // whole multiples of 32 scores
    return (usable - static_cast<int64_t>(scores_offset)) / 4 / 32 * 32;
  };
  const size_t page_bytes = static_cast<size_t>(kIndexCachedPages) * 4;
  launch.page_capacity = kIndexCachedPages;
  const size_t overlay_offset =
      std::max(select_bytes, align16(q_bytes) + weight_bytes + page_bytes);
  const int64_t overlay_chunk = std::min(kIndexMaxChunk, scores_room(overlay_offset));

  // Enough CTAs to keep a row's scores in shared memory; then, for few rows, more to use the SMs
  // (the CTAs of a cluster run at once, one per SM).
  int& cluster_size = plan.cluster_size;
  while (cluster_size < kIndexMaxCluster && ceil_div(capacity, cluster_size) > overlay_chunk)
    cluster_size *= 2;
  // Spreading takes the largest cluster whose rows' clusters all run at once (a second wave
  // costs more than the wider clusters save: H100, 16 rows x 65536 in clusters of 8 took 315 us,
  // 4 rows 163 us), whose CTAs keep 1024+ entries and fit the SMs. Any size counts, not only
  // powers of two (16 rows: clusters of 6, 17 of which an H100 runs at once, where 8 would need a
  // second wave and 4 leave half the SMs idle); above 8 only where the device runs clusters of 16.
  auto all_at_once = [&](int size) {
    const int limit = at(size);
    if (size > kIndexMaxCluster) return limit > 0 && num_rows <= limit;
    return limit == 0 || num_rows <= limit;
  };
  for (int size = clusters.largest(); spread && size > cluster_size; --size) {
    if (num_rows * size <= sm_count && ceil_div(capacity, size) >= kIndexSpreadEntries &&
        all_at_once(size)) {
      cluster_size = size;
      break;
    }
  }
  // Rows whose scores need more CTAs than the clusters of that size the device runs at once can
  // hold take waves; a wider cluster, where the device runs it, takes more waves of shorter CTAs.
  // Each choice costs waves x (entries a CTA + kIndexCtaFixedEntries), the fewest wins (16 rows
  // of 262144 entries on an H100: 3 waves of 16 CTAs, rather than 2 of 8).
  if (!all_at_once(cluster_size) && at(cluster_size) > 0) {
    auto cost = [&](int size) {
      const int64_t waves = ceil_div(num_rows, at(size));
      return waves * (ceil_div(capacity, size) + kIndexCtaFixedEntries);
    };
    int64_t best = cost(cluster_size);
    for (int size = cluster_size + 1; size <= clusters.largest(); ++size) {
      if (at(size) <= 0 || ceil_div(capacity, size) < kIndexSpreadEntries) continue;
      if (cost(size) < best) {
        best = cost(size);
        cluster_size = size;
      }
    }
  }
  const int64_t per_cta = std::max<int64_t>(ceil_div(capacity, cluster_size), 1);

  int64_t chunk_limit = overlay_chunk;
  launch.overlay = per_cta <= overlay_chunk;
  if (launch.overlay) {
    launch.q = 0;
    launch.weights = align16(q_bytes);
    launch.pages = launch.weights + weight_bytes;
    launch.scores = overlay_offset;
  } else {
    launch.weights = select_bytes;
    launch.pages = select_bytes + weight_bytes;
    launch.q = align_to_boundary(launch.pages + page_bytes);
    launch.scores = launch.q + align16(q_bytes);
    chunk_limit = std::min(kIndexMaxChunk, scores_room(launch.scores));
    if (chunk_limit < kIndexMinChunk) {
      throw Error("hdk::dsv4::index_topk: " + std::to_string(num_heads) +
                  " heads leave too little of the device's " + std::to_string(shared_limit) +
                  " bytes of shared memory per CTA for scores on CUDA");
    }
  }
  launch.q_lo = launch.q + fragment_bytes;
  launch.chunk = std::min(chunk_limit, ceil_div(per_cta, 32) * 32);
  launch.bytes = launch.scores + static_cast<size_t>(launch.chunk) * 4 + kIndexSharedAlignment;
  // Overlaid, the queries, weights and pages sit in the select's space: fp32 queries (32 KiB)
  // with a sort capacity of 512 reach the histogram.
  const size_t staged_end = std::max(
      {launch.q + align16(q_bytes), launch.weights + weight_bytes, launch.pages + page_bytes});
  launch.count_first_level =
      !launch.overlay || staged_end <= hdk::detail::select_layout(launch.sort_capacity).histogram;
  return plan;
}

// ---- Scoring over every SM through the workspace -------------------------------------------
// A row whose cluster would leave most SMs idle is scored by `segments` CTAs of its own (no
// cluster), each writing its entries' keys to the row's workspace score row; a second launch of
// one cluster per row (`select`, planned as above) loads them in place of scoring and selects.
// Fewest entries a scoring CTA takes (kIndexScoreMinEntries, attention_workspace.h): two
// 64-entry tiles. Against 256 (its two warpgroups' three tiles in flight each), one or two rows
// of 8192-16384 keys ran 1.02-1.14x faster on an H200 (16384 keys 26.8 -> 25.1 us), every other
// cell 0.99-1.01x: the scoring CTAs finish sooner than their staging costs.
// A row goes through the workspace only where its CTAs of this many entries would outnumber its
// cluster's CTAs: the rule as measured (H100), kept where 128 a CTA was not measured (rows of a
// few hundred keys keep one launch).
constexpr int64_t kIndexWorkspaceMinEntries = 256;

// E4M3 keys stream through the scoring kernel's key ring in shared memory, with so few registers
// that two of its CTAs share an SM: where that pays, every row goes through the workspace,
// kIndexMaxWorkspaceRows rows a launch of each kernel, a row in as many CTAs as keep two on every
// SM (kIndexStreamCtasPerSm). Measured against the one launch, whose E4M3 keys go through
// registers (H200, top 512 and 1024): up to 32 rows 1.03-1.29x at 2048-65536 entries; 64 rows
// 1.04x at 16384 entries, 1.13x at 65536, but 0.93-0.96x at 2048; beyond 64 rows, 64 a launch,
// 1.11-1.12x at 65536 entries but 0.88-0.90x at 16384. With the ring's tiles copied as whole
// pieces of their pages (index_key_ring_whole_pages) the ring is 1.10-1.14x
// faster and every row streams, kIndexStreamRowsPerLaunch rows a launch: against the one launch
// 64 rows of 2048 entries 1.04-1.10x, and against launches of 64 rows (with the rule before)
// 96 and 128 rows of 2048-16384 entries 1.13-1.48x, of 65536 0.99x and 1.05x (H200, two rounds
// each; 128 rows of 2048 in launches of 64 had been 0.74x the one launch). Which form streams
// which rows: index_ring_rows.
constexpr int64_t kIndexStreamCtasPerSm = 2;

// Which rows of a call whose scoring kernel has a key ring stream through it, and how many rows a
// launch of the scoring and select kernels takes.
enum class IndexRingRows {
  kByLength,  // E4M3 tiles copied by thread pairs: where index_rows_stream's sizes say, 64 a launch
  kEvery,     // every row, kIndexStreamRowsPerLaunch a launch (index_ring_rows says which forms)
};
inline bool index_rows_stream(int64_t num_rows, int64_t capacity, IndexRingRows rows) {
  if (rows == IndexRingRows::kEvery) return true;
  if (num_rows <= 32) return true;
  return capacity >= (num_rows <= kIndexMaxWorkspaceRows ? 16384 : 65536);
}

// Whether the key ring copies each tile as a whole piece of its page (two bulk copies, one
// thread): E4M3 keys and the packed MXFP4 q, pages of a multiple of 64 entries, 16-byte aligned
// (`wide`). The scoring kernel's segments start on multiples of 64 entries (index_score_segment),
// so every tile is then 64 consecutive entries of one page (a warpgroup with a single tile still
// copies it by threads). The exact q's MXFP4 tiles come by thread pairs: as whole pages they
// measured 0.97-1.02x (bf16 q) and 0.95-0.99x (fp32 q) on an H200, 1-128 rows of 2048-65536
// entries.
HDK_HOST_DEVICE constexpr bool index_form_takes_whole_pages(IndexQueryForm form) {
  return form != IndexQueryForm::kExact;
}
HDK_HOST_DEVICE bool index_key_ring_whole_pages(IndexQueryForm form, bool wide,
                                                int64_t block_size) {
  return index_form_takes_whole_pages(form) && wide && block_size % kFp8TileEntries == 0;
}

// MXFP4 keys with the packed query take the key ring only where it beat the workspace's or the
// cluster's register-fed scoring (H200, top 512 and 1024, 1-128 rows of 2048-262144 entries): rows
// of 16384 entries and more, from 8 rows 1.01-1.89x, fewer rows from 262144 keys in all
// 1.06-1.28x; 0.86-0.94x below that, where a scoring CTA has too few tiles to fill the ring (1 row
// of 65536, 2 or 4 rows of 16384), and 0.81-0.86x for 16 and 32 rows of 2048 (8 rows: 1.06x).
inline bool index_mxfp4_ring_pays(int64_t num_rows, int64_t capacity) {
  return capacity >= 16384 && (num_rows >= 8 || num_rows * capacity >= 262144);
}

// Whether a call's scoring kernel may stream its keys through a key ring: the FP8 forms on tensor
// cores, and the exact q over MXFP4 keys on the warpgroup kernel (`exact_mxfp4_warpgroup`; NVFP4
// keys, the warp kernel and CUDA cores score from registers).
inline bool index_form_has_key_ring(IndexQueryForm form, bool tensor, bool exact_mxfp4_warpgroup) {
  if (!tensor) return false;
  return form != IndexQueryForm::kExact || exact_mxfp4_warpgroup;
}

// The exact q over MXFP4 keys on the warpgroup kernel streams every row through the key ring,
// kIndexStreamRowsPerLaunch rows a launch. Its register-fed kernels keep two 64-entry tiles a
// warpgroup in flight where the ring keeps three, and run one CTA an SM where the ring runs two.
// Against them (H200, top 512 and 1024, 1-128 rows of 2048-65536 entries, two rounds): bf16 q
// 1.03-1.50x in every cell (8 x 65536 75.9 -> 50.8 us, 128 x 65536 508.4 -> 467.7), 1.03-1.72x
// with the instruction caches flushed; fp32 q 1.03-1.52x, but 0.96-0.98x where a warpgroup has one
// or two tiles (16 and 32 rows of 2048 entries, 2 rows of 16384; one rule serves both dtypes).
// Launches of 64 rows instead of 128 at 128 x 65536: 483.8 against 471.5 us.
// The packed MXFP4 q's ring is on only where it pays, and then every row streams, as many as
// kIndexStreamRowsPerLaunch a launch. Against the rule by sizes, which had kept rows of 16384-32768
// entries beyond 64 rows in the one launch and taken 64 + 1 launches for 65 rows of 65536 (H200,
// flash and pro, two rounds): 65-256 rows 1.22-1.86x at 16384-32768 entries (128 x 16384 195.5 ->
// 154.1 us, 72 x 32768 373.7 -> 201.7), 65 and 72 rows of 65536 1.32-1.72x. One launch of all rows
// against launches of 64 (H200, flash, two rounds): 67 and 70 rows 1.31-1.40x, 80 rows a tie, 100
// to 128 rows 1.02-1.15x, but 89 and 96 rows of 65536 entries 0.86-0.89x (178-192 scoring CTAs for
// 264 places, some SMs with one CTA among SMs with two) and ties at 16384. The split where the CTAs
// fill less than 80% of the places, for every streaming form: the exact q and E4M3 keys 0.63-0.98x
// at 67-104 rows, but the exact bf16 q 1.12-1.15x at 89 and 96 rows of 65536 entries.
inline IndexRingRows index_ring_rows(IndexQueryForm form, bool wide, int64_t block_size,
                                     bool exact_mxfp4_warpgroup) {
  switch (form) {
    case IndexQueryForm::kExact:
      return exact_mxfp4_warpgroup ? IndexRingRows::kEvery : IndexRingRows::kByLength;
    case IndexQueryForm::kMXFP4:
      return IndexRingRows::kEvery;
    case IndexQueryForm::kE4M3:
      break;
  }
  return index_key_ring_whole_pages(form, wide, block_size) ? IndexRingRows::kEvery
                                                            : IndexRingRows::kByLength;
}

// The key ring of the workspace's scoring kernel for a call, its CTAs of `warpgroups` warpgroups
// (0: the kernel scores from registers): E4M3 q over FP8 keys on tensor cores and the exact q over
// MXFP4 keys on the warpgroup kernel always stream, the packed MXFP4 q where
// index_mxfp4_ring_pays.
inline size_t index_key_ring_bytes(IndexQueryForm form, bool tensor, bool exact_mxfp4_warpgroup,
                                   int64_t num_rows, int64_t capacity, int warpgroups) {
  if (!index_form_has_key_ring(form, tensor, exact_mxfp4_warpgroup)) return 0;
  if (form == IndexQueryForm::kE4M3) return static_cast<size_t>(fp8_key_ring_bytes(warpgroups));
  if (form == IndexQueryForm::kExact || index_mxfp4_ring_pays(num_rows, capacity))
    return static_cast<size_t>(mxfp4_key_ring_bytes(warpgroups));
  return 0;
}

// Whether the workspace's scoring kernel streams MXFP4 keys through its key ring: where the plan
// says (kAuto, the default), never (kNever: from registers), or wherever the form has a ring and
// the workspace holds the rows, every row streaming (kAlways). E4M3 keys always stream. A tuning
// aid for A/B runs (`hdk-bench attention --index-ring`, set_index_key_ring_override).
enum class IndexKeyRingChoice { kAuto, kNever, kAlways };

// A call's key ring: its bytes (0: the scoring kernel scores from registers) and which rows stream
// through it, as the plan has them (index_key_ring_bytes, index_ring_rows) or as `choice` forces.
struct IndexKeyRing {
  size_t bytes = 0;
  IndexRingRows rows = IndexRingRows::kByLength;
};
inline IndexKeyRing index_key_ring(IndexQueryForm form, bool tensor, bool exact_mxfp4_warpgroup,
                                   bool wide, int64_t block_size, int64_t num_rows,
                                   int64_t capacity, int warpgroups,
                                   IndexKeyRingChoice choice = IndexKeyRingChoice::kAuto) {
  if (form != IndexQueryForm::kE4M3 && choice != IndexKeyRingChoice::kAuto) {
    const bool ring = choice == IndexKeyRingChoice::kAlways &&
                      index_form_has_key_ring(form, tensor, exact_mxfp4_warpgroup);
    return IndexKeyRing{ring ? static_cast<size_t>(mxfp4_key_ring_bytes(warpgroups)) : 0,
                        ring ? IndexRingRows::kEvery : IndexRingRows::kByLength};
  }
  return IndexKeyRing{
      index_key_ring_bytes(form, tensor, exact_mxfp4_warpgroup, num_rows, capacity, warpgroups),
      index_ring_rows(form, wide, block_size, exact_mxfp4_warpgroup)};
}

// Rows of up to this many entries are selected by one CTA each (cta_select, kCtaSelectThreads)
// instead of a cluster. Against the clusters (H200, one device call, two rounds, top 512 and 1024,
// 1-64 rows through the workspace, 1024 threads a CTA): 2048 keys a row 1.03-1.16x; 16384 keys
// 1.01-1.05x (MXFP4 keys, bf16 q), 1.02-1.07x (packed MXFP4 q), E4M3 keys 0.99-1.06x from 8 rows;
// rows of 8192 keys 1.02-1.17x in an earlier run. At 512 threads a CTA (1.03-1.10x faster than
// 1024), H200, two rounds: E4M3 rows of 16384 keys streamed 1-4 at a time 1.05-1.12x with the
// instruction caches flushed (one Flash row 26.3 -> 23.6 us), a tie (0.996-1.011x) with them warm,
// where they had kept the clusters at 1024 threads (0.97-0.99x); rows of 32768 keys 0.86-0.95x,
// one SM's passes over the keys costing more than the cluster's fixed time.
constexpr int64_t kIndexCtaSelectMaxEntries = 16384;
inline bool index_select_in_one_cta(int64_t capacity) {
  return capacity <= kIndexCtaSelectMaxEntries;
}

struct IndexWorkspacePlan {
  int64_t segments = 0;         // scoring CTAs per row; 0: the one-cluster plan runs, no workspace
  int64_t rows_per_launch = 0;  // rows a scoring and a select launch take (the last: the rest)
  IndexLaunch score;            // the scoring kernel's shared memory: queries, weights, block ids
  IndexLaunchPlan select;
  // The select runs a CTA a row (kCtaSelectThreads threads, cta_select) instead of `select`'s
  // clusters; `select` then has clusters of 1 that hold a whole row.
  bool select_in_one_cta = false;
  IndexWorkspaceLayout layout;  // where the keys and the rows' invalid flags lie
};

// Entries of each scoring CTA's share of a row of `length` entries split `segments` ways: whole
// 64-entry tiles (the warpgroup kernel's), the last CTAs possibly empty. index_score_tiles takes
// length / segments rounded up, which the scoring kernel gets from a FastDivide.
HDK_HOST_DEVICE int64_t index_score_tiles(int64_t even_share) {
  return (even_share + 63) / 64 * 64;
}
HDK_HOST_DEVICE int64_t index_score_segment(int64_t length, int64_t segments) {
  return index_score_tiles(hdk::detail::ceil_div(length, segments));
}

// The plan for a call with a workspace, given its one-cluster plan (`cluster_plan`, for the
// scoring kernel's clusters) and the clusters the select kernel runs at once. `key_ring_bytes`:
// the scoring kernel's key ring (0: the kernel scores from registers); its rows stream where
// index_rows_stream says so for `ring_rows` (index_ring_rows). Otherwise
// segments = 0 where the rows are more than kIndexMaxWorkspaceRows or their clusters already keep
// half the SMs or more busy, or where scoring CTAs of kIndexWorkspaceMinEntries would be no more
// than the cluster's.
inline IndexWorkspacePlan plan_index_workspace(
    int64_t num_rows, int64_t num_heads, int64_t capacity, int64_t top_k, bool tensor, bool fp32_q,
    int sm_count, int shared_limit, const IndexLaunchPlan& cluster_plan,
    const hdk::detail::ResidentClusterCounts& select_clusters =
        hdk::detail::ResidentClusterCounts(),
    size_t key_ring_bytes = 0, IndexRingRows ring_rows = IndexRingRows::kByLength) {
  IndexWorkspacePlan plan;
  if (num_rows <= 0 || capacity <= 0) return plan;
  const int64_t tiles = (capacity + kIndexScoreMinEntries - 1) / kIndexScoreMinEntries;
  if (key_ring_bytes > 0 && index_rows_stream(num_rows, capacity, ring_rows)) {
    plan.rows_per_launch =
        std::min(num_rows, ring_rows == IndexRingRows::kEvery ? kIndexStreamRowsPerLaunch
                                                              : kIndexMaxWorkspaceRows);
    plan.segments = std::min<int64_t>(
        tiles, std::max<int64_t>(1, kIndexStreamCtasPerSm * sm_count / plan.rows_per_launch));
  } else {
    if (num_rows > kIndexMaxWorkspaceRows) return plan;
    const int64_t busy = std::min<int64_t>(num_rows * cluster_plan.cluster_size, sm_count);
    if (2 * busy > sm_count) return plan;
    auto ctas_of = [&](int64_t entries) {
      return std::min<int64_t>(sm_count / num_rows, (capacity + entries - 1) / entries);
    };
    if (ctas_of(kIndexWorkspaceMinEntries) <= cluster_plan.cluster_size) return plan;
    plan.segments = ctas_of(kIndexScoreMinEntries);
    plan.rows_per_launch = num_rows;
  }
  // The scoring kernel stages what the cluster kernel does (queries on a 1024-byte boundary)
  // and keeps no scores: they go to the workspace.
  const IndexLaunch& staged = cluster_plan.launch;
  IndexLaunch& score = plan.score;
  score.sort_capacity = staged.sort_capacity;
  score.m_tiles = staged.m_tiles;
  score.staged_heads = staged.staged_heads;
  score.page_capacity = staged.page_capacity;
  const size_t query_bytes = index_query_bytes(num_heads, staged.staged_heads, tensor, fp32_q);
  score.q = 0;
  score.q_lo = index_fragment_bytes(staged.staged_heads);
  score.weights = align16(query_bytes);
  score.pages = score.weights + align16(static_cast<size_t>(staged.staged_heads) * 4);
  score.scores = score.pages + static_cast<size_t>(staged.page_capacity) * 4;
  score.chunk = 0;
  score.bytes = score.scores;
  if (key_ring_bytes > 0) {
    score.key_ring = align_to_boundary(score.bytes);
    score.key_ring_bytes = key_ring_bytes;
    score.bytes = score.key_ring + key_ring_bytes;
  }
  score.bytes += kIndexSharedAlignment;
  // The select stages nothing: planned with the fewest staged queries (one bf16 head), its
  // shared memory is the select's and the scores'; nothing else lies in its first-level
  // histogram, so it counts that level while it loads the keys.
  // A row the rule gives one CTA is planned without spreading; where its keys do not fit that
  // CTA (a top_k whose sort takes the room), clusters select it after all.
  auto plan_select = [&](bool spread) {
    return plan_index_launch(plan.rows_per_launch, 1, capacity, top_k, true, false, sm_count,
                             shared_limit, select_clusters, spread);
  };
  if (index_select_in_one_cta(capacity)) {
    plan.select = plan_select(false);
    plan.select_in_one_cta = plan.select.cluster_size == 1 && plan.select.launch.chunk >= capacity;
  }
  if (!plan.select_in_one_cta) plan.select = plan_select(true);
  plan.select.launch.count_first_level = true;
  plan.layout = index_workspace_layout(num_rows, capacity);
  return plan;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
