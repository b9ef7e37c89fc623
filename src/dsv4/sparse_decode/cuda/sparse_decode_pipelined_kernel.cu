// sparse_decode's warp-specialized (pipelined) tensor-core kernel: the clusters, tiles and
// finish_row of the tensor-core kernel (sparse_decode_mma_kernel.cu), with the work split by
// role. The dispatcher runs it from 3 tiles a CTA (kPipelinedMinTiles in sparse_decode_cuda.cu).
// Design: docs/dsv4-attention.md ("sparse_decode on CUDA", "Pipelined kernel").
//
// Three warpgroups and two E stages, so the dequantization of one tile runs while the tensor cores
// multiply the one before it (the mma kernel runs them one after the other on 8 warps):
// - warpgroup 2, the producer, loads each tile's stored bytes, one pass (or, with two head
//   groups, every other tile) into registers and the other into a raw pass in shared memory
//   (cp.async: a use of a loaded register would also wait for every load issued after it),
//   dequantizes them into E stage t % 2 and signals it full; the next tile's bytes are loaded
//   while this one is converted;
// - warpgroup 0 computes the whole S = Q E^T (64 heads x 64 entries over all 512 dims, so no
//   partial S is exchanged), runs the online softmax, hands P (bf16) and the rows' rescale
//   factors to warpgroup 1 through shared memory and computes O's columns 0..255 with P from its
//   registers;
// - warpgroup 1 rescales and computes O's columns 256..511 with P read from shared memory.
// Handshakes are shared-memory barriers (mbarrier.cuh), every thread of the signalling side
// arriving: stage full (the producer arrives, both consumers wait), stage empty (both consumers
// arrive, the producer waits before refilling it), P ready and P free between the consumers, Q
// ready for warpgroup 0, and warpgroup 0's registers given back (before the others take theirs
// back).
// With two head groups (Hq 65..128, kSharedConversion) the two CTAs of a row slice read the same
// entries, so each converts half of every tile (entries 32 g .. 32 g + 31 for group g) and copies
// its rows into the other's stage (cp.async.bulk between the CTAs' shared memories, the bytes
// completing on the receiver's full barrier); the receiver's consumers also arrive, once a
// warp, on the sender's empty barrier, since the sender refills both copies of a stage.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/elect_lane.cuh"
#include "core/cuda/mbarrier.cuh"
#include "core/cuda/shared_address.cuh"
#include "core/cuda/thread_index.cuh"
#include "core/cuda/wgmma.cuh"
#include "core/fast_divide.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_device.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_entry_share.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_finish.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::bulk_copy_to_peer;
using hdk::detail::cluster_shared_address;
using hdk::detail::cp_async_commit;
using hdk::detail::cp_async_wait;
using hdk::detail::mbarrier_arrive;
using hdk::detail::mbarrier_arrive_expect_bytes;
using hdk::detail::mbarrier_arrive_remote;
using hdk::detail::mbarrier_init;
using hdk::detail::mbarrier_test;
using hdk::detail::mbarrier_wait;

constexpr int kPipelinedStages = 2;
constexpr int kProducerThread0 = 256;                    // warpgroup 2
constexpr int kPipeBarriers = 2 * kPipelinedStages + 5;  // PipelineBarriers

// A CTA's shared memory, from a 1024-byte boundary (wgmma's swizzle atom). After the list, the
// CTA's unnormalized O ([64][kStageStride] fp32) overlays q and the E stages.
// The raw tile is addressed as smem + offsetof(...): through the member (shared.raw[e]) NVVM
// folds the constant offset later and the generated code changes.
struct PipelinedSharedMemory {
  uint8_t q[kQBytes];                              // 64 heads x 512 bf16 (load_queries)
  uint8_t e[kPipelinedStages][kEBytes];            // the E stages
  uint8_t p[operand_block_bytes(kHeads)];          // P, 64 x 64 bf16, an operand tile
  float alpha[kHeads];                             // the rows' rescale factors
  int valid[kPipelinedStages][kTile];              // which entries of each stage are real
  float stat_m[kHeads];                            // row maxima (log2 units)
  float stat_l[kHeads];                            // row sums
  float sink[kHeads];                              // the heads' sinks (load_sink)
  int bad;                                         // the CTA's invalid-row flag
  uint32_t early_votes[2];                         // warpgroup 0's, a byte a warp, by tile parity
  int unused;                                      // pads the words to 16 bytes
  float factors[kSparseMaxWideCluster][kHeads];    // each split's weight in the combined row
  uint64_t barriers[(kPipeBarriers + 1) / 2 * 2];  // PipelineBarriers (raw at 16 bytes)
  // One pass of a tile as stored (32 entries of kRawEntryStride bytes: data, then the 8 scale
  // bytes), where the producer lands the bytes it does not load into registers
  // (copy_share_async): pass 1 of the next tile, or with a shared conversion every odd tile.
  uint8_t raw[32][kRawEntryStride];
};
// What a CTA's full barrier expects from the peer per tile with a shared conversion: half the
// stage's rows and half its real-entry flags.
constexpr uint32_t kSharedBytesFromPeer = kEBytes / 2 + kTile / 2 * 4;
static_assert(offsetof(PipelinedSharedMemory, valid) % 16 == 0,
              "bulk copies of the flags need 16-byte alignment");
static_assert(kSharedBytesFromPeer % 128 == 0, "each producer thread expects an equal share");
constexpr int kPipelinedSharedBytes =
    static_cast<int>(sizeof(PipelinedSharedMemory)) + kSwizzleAtomBytes;
static_assert(kHeads * kStageStride * 4 <= static_cast<int>(offsetof(PipelinedSharedMemory, p)),
              "O staging overlaps");
static_assert(kPipelinedSharedBytes <= 227 * 1024, "shared memory beyond an SM's");
static_assert(offsetof(PipelinedSharedMemory, p) % kSwizzleAtomBytes == 0,
              "P is a swizzled operand tile");
static_assert(offsetof(PipelinedSharedMemory, raw) % 16 == 0 && kRawEntryStride % 16 == 0 &&
                  kRawEntryStride >= kEntryDataBytes + kEntryScaleBytes,
              "a raw entry holds its data and scale bytes at 16-byte alignment");

// Registers per thread of each warpgroup after setmaxnreg: the launch gives every thread 168
// (65536 / 384, rounded down to 8) and the three counts may not add up to more than 3 x 168.
constexpr int kLaunchRegisters = 168;
constexpr int kScoreRegistersCap = 208;  // S (32) + O (128) + P fragments (16)
constexpr int kOutputRegistersCap = 160;
constexpr int kProducerRegistersCap = 136;
static_assert(kScoreRegistersCap + kOutputRegistersCap + kProducerRegistersCap <=
                  3 * kLaunchRegisters,
              "the warpgroups' registers exceed what the launch gave the CTA");

// The handshakes' barriers (PipelinedSharedMemory::barriers) and who arrives on each, every thread
// once per phase: one arrival a warp after __syncwarp would order the same accesses, but racecheck
// credits an arrival with its own thread's accesses only and then reports the stage's real-entry
// flags.
struct PipelineBarriers {
  uint64_t* full;            // [stage] the producer
  uint64_t* empty;           // [stage] both consumers
  uint64_t* p_ready;         // warpgroup 0
  uint64_t* p_free;          // warpgroup 1
  uint64_t* queries_ready;   // both consumers: Q loaded, checked, fenced
  uint64_t* registers_back;  // warpgroup 0, back at the launch's register count
  uint64_t* early_voted;     // warpgroup 0, its warps' votes on the early release stored
};
__device__ __forceinline__ PipelineBarriers pipeline_barriers(PipelinedSharedMemory& shared) {
  uint64_t* base = shared.barriers;
  uint64_t* single = base + 2 * kPipelinedStages;  // the barriers without a stage
  return {base, base + kPipelinedStages, single, single + 1, single + 2, single + 3, single + 4};
}
// `shared_conversion`: the peer CTA's half of each stage arrives by bulk copies (bytes on the
// full barrier, expected by this CTA's producer), and each warp of its two consumer warpgroups
// arrives once on the empty barrier when it no longer reads its own copy of the stage.
constexpr int kPeerArrivals = 4;  // a consumer warpgroup's warps
__device__ __forceinline__ void init_pipeline_barriers(const PipelineBarriers& barriers,
                                                       bool shared_conversion) {
  for (int stage = 0; stage < kPipelinedStages; ++stage) {
    mbarrier_init(barriers.full + stage, 128);
    mbarrier_init(barriers.empty + stage, 2 * 128 + (shared_conversion ? 2 * kPeerArrivals : 0));
  }
  mbarrier_init(barriers.p_ready, 128);
  mbarrier_init(barriers.p_free, 128);
  mbarrier_init(barriers.queries_ready, 2 * 128);
  mbarrier_init(barriers.registers_back, 128);
  mbarrier_init(barriers.early_voted, 128);
}
template <int kRegisters>
__device__ __forceinline__ void raise_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void lower_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <bool kWide, bool kSharedConversion, SparsePartials kPartials>
__global__ void __launch_bounds__(kSparsePipelinedThreads, 1)
    sparse_decode_pipelined_kernel(SparseDecodeProblem p, SparsePlan plan, bool q_vector,
                                   bool out_vector) {
  // One copy of the conversion loop where a producer converts half of each tile (ShareScaling).
  constexpr ShareScaling kScaling =
      kSharedConversion ? ShareScaling::kTwo : ShareScaling::kOneWhereExact;
  constexpr bool kThroughWorkspace = kPartials != SparsePartials::kInCluster;
  hdk::detail::begin_dependent_kernel();
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  uint8_t* smem =
      shared_bytes +
      (kSwizzleAtomBytes - shared_address(shared_bytes) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  cg::cluster_group cluster = cg::this_cluster();
  const CtaRole role = cta_role<kThroughWorkspace>(plan);
  const int64_t n = role.n;
  const int group = role.group, split = role.split;
  const int64_t head0 = int64_t{group} * kHeads;
  const int tid = threadIdx.x, lane = tid % 32;
  const int warpgroup = tid / 128;
  const int thread = tid % 128;  // in the warpgroup

  PipelinedSharedMemory& shared = *reinterpret_cast<PipelinedSharedMemory*>(smem);
  int* valid = shared.valid[0];
  float* alpha_shared = shared.alpha;
  int* bad = &shared.bad;
  const CtaSpace space{reinterpret_cast<float*>(shared.q),
                       shared.stat_m,
                       shared.stat_l,
                       shared.sink,
                       bad,
                       shared.factors[0]};
  const PipelineBarriers barriers = pipeline_barriers(shared);
  // With kSharedConversion (two head groups) each CTA converts half of every tile for itself
  // and for its peer, the CTA of the other group walking the same slice: a stage is full once
  // this CTA's producer has arrived and the peer's half has landed, and empty once this CTA's
  // consumers and the peer's have let it go.
  const int peer = kThroughWorkspace ? 1 - group : split * plan.groups + (1 - group);
  if (tid == 0) {
    *bad = 0;
    init_pipeline_barriers(barriers, kSharedConversion);
  }
  if (kSharedConversion) {
    cluster.sync();  // the peer's barriers are initialized before this CTA arrives on them
  } else {
    __syncthreads();
  }

  const int64_t tiles = (p.list_length() + kTile - 1) / kTile;
  const int64_t first = split_first_tile(tiles, split, plan.splits);
  const int64_t count = split_first_tile(tiles, split + 1, plan.splits) - first;
  const uint32_t e_tiles = shared_address(shared.e);
  // Tile i's phase of its stage's barriers: full completes once per tile of the stage; empty
  // once per tile that a later tile of the stage follows (tile i waits for tile i - 2's).
  auto full_parity = [](int64_t i) { return static_cast<uint32_t>((i >> 1) & 1); };
  auto empty_parity = [](int64_t i) { return static_cast<uint32_t>(((i >> 1) + 1) & 1); };
  auto stage_address = [&](int64_t i) { return e_tiles + static_cast<uint32_t>(i & 1) * kEBytes; };
  float o[128];
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  const bool q_async = q_vector && p.q.dtype != DType::kFloat32;

  if (warpgroup == 2) {
    // ---- producer -----------------------------------------------------------------------------
    lower_registers<kProducerRegistersCap>();
    const int producer_warp = (tid - kProducerThread0) / 32;
    const int quarter = lane / 8;
    // Entries pass * 32 + entry_in_pass of each tile.
    const int entry_in_pass = producer_warp * 8 + lane % 8;
    // Where two head groups share the conversion (Pro), the thread's place (its quarter of an
    // entry, its entry of a pass, its row of the raw pass) is read from %tid.x where it is used:
    // kept in a register across that loop it was spilled, and its reload waited behind every
    // global load in flight (the producer's loads share one dependency counter). Flash's
    // producer, bound by its instructions, keeps it (read at each use there: 0.95-0.98x).
    auto thread_now = [] { return hdk::detail::thread_index_now() - kProducerThread0; };
    auto quarter_now = [&] { return thread_now() % 32 / 8; };
    auto entry_in_pass_now = [&] {
      const int t = thread_now();
      return t / 32 * 8 + t % 8;
    };
    auto raw_row = [&] {
      return smem + offsetof(PipelinedSharedMemory, raw) + entry_in_pass_now() * kRawEntryStride;
    };
    auto entry_index = [&](int64_t i, int pass) {
      return (first + i) * kTile + pass * 32 +
             (kSharedConversion ? entry_in_pass_now() : entry_in_pass);
    };
    const hdk::detail::FastDivide pages[2] = {
        hdk::detail::FastDivide(static_cast<uint32_t>(p.cache.block_size)),
        hdk::detail::FastDivide(
            static_cast<uint32_t>(p.extra_cache.block_size > 0 ? p.extra_cache.block_size : 1))};
    // The launcher runs this kernel only where one of the pools has a slot (and none has 2^31).
    const PagedPool& dummy_pool = p.cache.num_slots() > 0 ? p.cache : p.extra_cache;
    const ProducerEntry dummy{dummy_pool.data,
                              dummy_pool.data + dummy_pool.block_size * kEntryDataBytes, false};
    // Entry `pass * 32 + entry_in_pass` of tile t, whose slot is `slot`.
    auto entry_of = [&](int64_t t, int pass, const LoadedSlot& slot) {
      return producer_entry(p, entry_index(t, pass), slot_value(slot), pages, dummy, bad);
    };
    EntryShare share;  // the bytes that come through registers (raw pass: the others)
    bool real[2];
    uint32_t nan_bits = 0;
    if constexpr (kSharedConversion) {
      // Pass `group` of every tile: converted into this CTA's stage, from where each warp's rows
      // and real-entry flags go to the peer's stage by bulk copies (cp.async.bulk, completing
      // bytes on the peer's full barrier). Two tiles' bytes are in flight behind the conversion
      // (below: one in registers, one in the raw pass).
      const int pass = group;
      auto entry_now = [&] { return pass * 32 + entry_in_pass_now(); };
      const uint32_t valid_flags = shared_address(valid);
      // A CTA's shared memory is one range of the cluster's shared window, so the peer's copy
      // of any of this CTA's variables lies one distance away (one register, not three).
      const uint32_t to_peer = cluster_shared_address(e_tiles, peer) - e_tiles;
      // Even tiles come through registers (share), odd tiles through this thread's row of the
      // raw pass (copy_share_async), each requested two tiles before it is converted. An even
      // step locates the entries of both next tiles (t + 2 and t + 3) from slots loaded two
      // tiles earlier, so that an odd step uses no loaded register: the use of one would also
      // wait for the even tile's loads issued just before it (see copy_share_async).
      LoadedSlot slot_ahead[2];         // at an even tile t, the slots of tiles t + 2 and t + 3
      ProducerEntry odd_ahead = dummy;  // from an even tile t on, tile t + 3's entry
      if (count > 0) {
        const LoadedSlot first_slots[2] = {load_slot_now(p, n, entry_index(0, pass)),
                                           load_slot_now(p, n, entry_index(1, pass))};
        slot_ahead[0] = load_slot_now(p, n, entry_index(2, pass));
        slot_ahead[1] = load_slot_now(p, n, entry_index(3, pass));
        // Tile 1 of a one-tile slice: the next slice's entries (or past the list), unused.
        const ProducerEntry first_entries[2] = {entry_of(0, pass, first_slots[0]),
                                                entry_of(1, pass, first_slots[1])};
        real[0] = first_entries[0].real;
        real[1] = first_entries[1].real;
        load_share<kWide>(first_entries[0], quarter_now(), share);
        copy_share_async<kWide>(first_entries[1], quarter_now(), raw_row());
        cp_async_commit();
      }
      // Tile t, whose stage is t % 2 (`slot`).
      auto step = [&](int64_t t, int slot) {
        ProducerEntry even_ahead = dummy;
        if (slot == 0) {
          even_ahead = entry_of(t + 2, pass, slot_ahead[0]);
          odd_ahead = entry_of(t + 3, pass, slot_ahead[1]);
        }
        if (t >= kPipelinedStages) mbarrier_wait(barriers.empty + slot, empty_parity(t));
        if (slot == 0) {
          nan_bits |=
              store_share<kScaling>(share, real[0], stage_address(t), entry_now(), quarter_now());
          // Tiles t + 4 and t + 5's slots only now: the conversion's first use of the share
          // waits for every load in flight, and would have waited for these too.
          slot_ahead[0] = load_slot_now(p, n, entry_index(t + 4, pass));
          slot_ahead[1] = load_slot_now(p, n, entry_index(t + 5, pass));
        } else {
          cp_async_wait<0>();
          __syncwarp();  // quarter 0's copy of the entry's scale bytes has landed
          nan_bits |= store_share<kScaling>(read_share(raw_row(), quarter_now()), real[1],
                                            stage_address(t), entry_now(), quarter_now());
        }
        if (quarter_now() == 0) valid[slot * kTile + entry_now()] = real[slot] ? 1 : 0;
        fence_shared_for_wgmma();  // for this CTA's wgmma and for the bulk copies
        __syncwarp();  // (and every quarter has read the raw scale bytes quarter 0 copies next)
        const uint32_t full = shared_address(barriers.full + slot);
        if (hdk::detail::elect_one_lane()) {
          // This warp's 8 rows in each of the 8 column blocks of a stage, and its 8 flags.
          const uint32_t warp_rows = static_cast<uint32_t>(pass * 32 + thread_now() / 32 * 8);
#pragma unroll
          for (int block = 0; block < 8; ++block) {
            const uint32_t offset = static_cast<uint32_t>(slot) * kEBytes +
                                    block * operand_block_bytes(kTile) + warp_rows * 128;
            bulk_copy_to_peer(e_tiles + offset + to_peer, e_tiles + offset, 8 * 128,
                              full + to_peer);
          }
          const uint32_t flags = (static_cast<uint32_t>(slot) * kTile + warp_rows) * 4;
          bulk_copy_to_peer(valid_flags + flags + to_peer, valid_flags + flags, 8 * 4,
                            full + to_peer);
        }
        // The copies have read this stage before it is refilled: that waits for the peer's
        // consumers, who wait for the copies to land.
        // Every producer thread expects its share of the peer's bytes: no thread is singled
        // out by a branch (a branch on the thread index here waited on a spilled register).
        mbarrier_arrive_expect_bytes(barriers.full + slot, kSharedBytesFromPeer / 128);
        if (t + 2 < count) {
          if (slot == 0) {
            real[0] = even_ahead.real;
            load_share<kWide>(even_ahead, quarter_now(), share);
          } else {
            real[1] = odd_ahead.real;
            copy_share_async<kWide>(odd_ahead, quarter_now(), raw_row());
            cp_async_commit();
          }
        }
      };
      for (int64_t t = 0; t < count; t += 2) {
        step(t, 0);
        if (t + 1 < count) step(t + 1, 1);
      }
    } else {
      // Pass 0 of a tile comes through registers (share), pass 1 through this thread's row
      // of the raw pass (copy_share_async), each requested once the previous tile's pass has
      // been converted, so that a tile's two waits are for bytes a tile old.
      uint8_t* raw = smem + offsetof(PipelinedSharedMemory, raw) + entry_in_pass * kRawEntryStride;
      LoadedSlot slot_ahead[2];  // the slots of tile i + 1, loaded a tile early
      if (count > 0) {
        // The first two tiles' slots in one round trip, then the first tile's bytes.
        LoadedSlot first_slots[2];
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          first_slots[pass] = load_slot_now(p, n, entry_index(0, pass));
          slot_ahead[pass] = load_slot_now(p, n, entry_index(1, pass));
        }
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          const ProducerEntry entry = entry_of(0, pass, first_slots[pass]);
          real[pass] = entry.real;
          if (pass == 0) {
            load_share<kWide>(entry, quarter, share);
          } else {
            copy_share_async<kWide>(entry, quarter, raw);
            cp_async_commit();
          }
        }
      }
      for (int64_t i = 0; i < count; ++i) {
        const int stage = static_cast<int>(i & 1);
        // Tile i + 1's entries and tile i + 2's slots without a branch: past the slice they are
        // the next slice's (or past the list) and go unused; a slot of the row beyond its cache
        // marks the row bad in whichever CTA of its cluster finds it.
        ProducerEntry next[2];
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          next[pass] = entry_of(i + 1, pass, slot_ahead[pass]);
          slot_ahead[pass] = load_slot_now(p, n, entry_index(i + 2, pass));
        }
        if (i >= kPipelinedStages) mbarrier_wait(barriers.empty + stage, empty_parity(i));
        // The next tile's bytes are requested once this tile's pass is converted: pass 0's
        // while pass 1 converts, pass 1's after the stage is signalled full, so that the fence
        // and the signal do not wait behind copies just issued (on an H100, loading pass 1
        // before the signal was 4-5% slower on the long lists, when both passes were loads).
        auto convert = [&](int pass, const EntryShare& bytes) {
          const int entry = pass * 32 + entry_in_pass;
          nan_bits |= store_share<kScaling>(bytes, real[pass], stage_address(i), entry, quarter);
          if (quarter == 0) valid[stage * kTile + entry] = real[pass] ? 1 : 0;
        };
        const bool more = i + 1 < count;
        convert(0, share);
        if (more) {
          real[0] = next[0].real;
          load_share<kWide>(next[0], quarter, share);
        }
        cp_async_wait<0>();
        __syncwarp();  // quarter 0's copy of the entry's scale bytes has landed
        convert(1, read_share(raw, quarter));
        fence_shared_for_wgmma();
        mbarrier_arrive(barriers.full + stage);
        __syncwarp();  // every quarter has read the scale bytes that quarter 0 copies next
        if (more) {
          real[1] = next[1].real;
          copy_share_async<kWide>(next[1], quarter, raw);
          cp_async_commit();
        }
      }
    }
    // No copy outlives the producer's part: a one-tile slice of the shared form requested
    // tile 1's bytes, which nothing waits for.
    cp_async_wait<0>();
    if (nan_bits != 0) *bad = 1;
    // Taking registers back before warpgroup 0 has raised its own could leave it waiting for
    // them while the consumers wait for it: only once it has given them back.
    mbarrier_wait(barriers.registers_back, 0);
    raise_registers<kLaunchRegisters>();
  } else {
    // ---- consumers: the queries first ---------------------------------------------------------
    const float sink = load_sink(p, head0, tid);
    load_queries(p, n, head0, q_async, q_vector, shared.q, bad, tid);
    cp_async_commit();
    cp_async_wait<0>();
    if (tid < kHeads) shared.sink[tid] = sink;  // read back by the same thread in finish_row
    // Checked now, not after the list: the last reads of Q by the threads are then far from the
    // O staging that overwrites it.
    if (q_async && !queries_finite(shared.q, tid)) *bad = 1;
    fence_shared_for_wgmma();
    mbarrier_arrive(barriers.queries_ready);  // warpgroup 0 waits for it; warpgroup 1 never reads Q
#pragma unroll
    for (int i = 0; i < 128; ++i)
      o[i] = 0.0f;
    const uint32_t p_tile = shared_address(shared.p);
    const int warp_rows = 16 * ((tid / 32) % 4) + lane / 4;  // rows warp_rows and + 8
    // A stage's bytes come from both CTAs' producers with kSharedConversion, and both must know
    // when it is free again.
    const uint32_t peer_empty =
        kSharedConversion ? cluster_shared_address(shared_address(barriers.empty), peer) : 0u;
    // The peer's arrivals come from one lane a warp (elected: a thread index kept for this
    // test spilled and was reloaded at every tile): after the warp's wgmma_wait none of its
    // products reads the stage any more.
    auto release_stage = [&](int stage) {
      mbarrier_arrive(barriers.empty + stage);
      if (kSharedConversion && hdk::detail::elect_one_lane()) {
        mbarrier_arrive_remote(peer_empty + static_cast<uint32_t>(stage) * 8);
      }
    };
    if (warpgroup == 0) {
      raise_registers<kScoreRegistersCap>();
      // Pro's workspace instances keep their place in no register across the loop (it was
      // spilled there, and each reload waited behind the tile's loads): read from %tid.x at
      // each use. In the cluster instances the same re-reads cost 0.96-0.98x.
      constexpr bool kPlaceNow = kSharedConversion && kThroughWorkspace;
      auto thread_now = [&] { return kPlaceNow ? hdk::detail::thread_index_now() % 128 : thread; };
      mbarrier_wait(barriers.queries_ready, 0);
      // Descriptors are made once (Q) or once a tile (E) and advanced by each k-step's constant
      // offset from k-step 0 (which starts at offset 0): made whole for every product they took
      // 12 uniform instructions a wgmma.
      static_assert(scores_operand(0, kHeads).start == 0 && scores_operand(0, kTile).start == 0 &&
                        outputs_operand(0, 0, kTile).start == 0,
                    "k-step 0 of each operand starts at its tile");
      const uint64_t q_scores =
          wgmma_descriptor(shared_address(shared.q), scores_operand(0, kHeads));
      const float score_scale = p.scale * kLog2e;
      // Whether any warp of the warpgroup found tile i (> 0) not converted yet: each warp stores
      // its vote in its byte of the tile parity's word, and every thread arrives (so that its
      // read of the word two votes back is ordered before the rewrite). A named barrier's
      // reduction (barrier.red) would do it in one instruction, but racecheck then reports
      // every later exchange through __syncthreads as a race (a named barrier in only some of a
      // CTA's warps upsets its model).
      auto early_vote = [&](int64_t i, bool want) {
        const uint32_t votes =
            shared_address(shared.early_votes) + 4 * static_cast<uint32_t>(i & 1);
        const uint32_t warp_wants = __any_sync(kFullMask, want) ? 1 : 0;
        if (hdk::detail::elect_one_lane()) {
          const uint32_t byte = votes + static_cast<uint32_t>(hdk::detail::thread_index_now()) / 32;
          asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(byte), "r"(warp_wants) : "memory");
        }
        mbarrier_arrive(barriers.early_voted);
        mbarrier_wait(barriers.early_voted, static_cast<uint32_t>((i - 1) & 1));
        uint32_t word;
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(word) : "r"(votes) : "memory");
        return word != 0;
      };
      for (int64_t i = 0; i < count; ++i) {
        const int stage = static_cast<int>(i & 1);
        const uint32_t e_tile = stage_address(i);
        const uint64_t e_scores = wgmma_descriptor(e_tile, scores_operand(0, kTile));
        const uint64_t e_outputs = wgmma_descriptor(e_tile, outputs_operand(0, 0, kTile));
        const int* tile_valid = valid + stage * kTile;
        // The last tile's stage is released once this warpgroup's O product on it is done. Where
        // this tile is not converted yet, that is now: the producer, which refills that stage
        // next, is behind, and releasing only after this tile's S was issued would add a round
        // trip between the warpgroups to its every tile. The warpgroup decides together
        // (early_vote): its warps' wgmma instructions must follow one sequence, which a warp
        // that tested just before the phase completed and one that tested just after would not.
        bool released = i == 0;
        if (!released && early_vote(i, !mbarrier_test(barriers.full + stage, full_parity(i)))) {
          wgmma_wait<0>();
          if (i + 1 < count) release_stage(stage ^ 1);
          released = true;
        }
        mbarrier_wait(barriers.full + stage, full_parity(i));
        float s[kScoreRegisters];
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 32; ++k) {
          wgmma_m64n64k16(s, wgmma_descriptor_advance(q_scores, scores_operand(k, kHeads).start),
                          wgmma_descriptor_advance(e_scores, scores_operand(k, kTile).start),
                          k > 0);
        }
        wgmma_commit();
        if (!released) {
          wgmma_wait<1>();  // the last tile's O product: its stage is free on this side
          if (i + 1 < count) release_stage(stage ^ 1);
        }
        wgmma_wait<0>();
        wgmma_fence_accumulators(s);
        wgmma_fence_accumulators(o);

        float alpha[2];
        constexpr int kSteps = kTile / 16;
        uint32_t weights[kSteps][4];
        softmax_tile(s, tile_valid, thread_now(), score_scale, row_max, row_sum, o, alpha, weights);
        // P and the rescale factors for warpgroup 1, once it is done with the last tile's.
        if (i > 0) mbarrier_wait(barriers.p_free, static_cast<uint32_t>((i - 1) & 1));
#pragma unroll
        for (int k = 0; k < kSteps; ++k) {
#pragma unroll
          for (int reg = 0; reg < 4; ++reg) {
            const MatrixCoord at = wgmma_a_coord(thread_now(), reg, 0);
            const int col = at.col + 16 * k;
            const uint32_t target =
                p_tile + operand_chunk_offset(at.row, col / 8, kHeads) + (col % 8) * 2;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(target), "r"(weights[k][reg])
                         : "memory");
          }
        }
        // The lane from %tid.x in every instance: kept for this test beside the vote's
        // registers it was spilled and reloaded at every tile in two of the cluster instances.
        if (hdk::detail::thread_index_now() % 4 == 0) {
          const int rows = kPlaceNow ? 16 * (thread_now() / 32) + thread_now() % 32 / 4 : warp_rows;
          alpha_shared[rows] = alpha[0];
          alpha_shared[rows + 8] = alpha[1];
        }
        fence_shared_for_wgmma();
        mbarrier_arrive(barriers.p_ready);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kSteps; ++k) {
          wgmma_m64n256k16_a_registers(
              o, weights[k],
              wgmma_descriptor_advance(e_outputs, outputs_operand(0, k, kTile).start));
        }
        wgmma_commit();
      }
      wgmma_wait<0>();
      wgmma_fence_accumulators(o);
      lower_registers<kLaunchRegisters>();
      mbarrier_arrive(barriers.registers_back);
    } else {
      lower_registers<kOutputRegistersCap>();
      const uint64_t p_scores = wgmma_descriptor(p_tile, scores_operand(0, kHeads));
      // Offsets from the half's first k-step: outputs_operand(1, 0, ...) starts 4 blocks in.
      const int half_start = outputs_operand(1, 0, kTile).start;
      for (int64_t i = 0; i < count; ++i) {
        const int stage = static_cast<int>(i & 1);
        const uint32_t e_tile = stage_address(i);
        const uint64_t e_outputs = wgmma_descriptor(e_tile, outputs_operand(1, 0, kTile));
        mbarrier_wait(barriers.full + stage, full_parity(i));
        mbarrier_wait(barriers.p_ready, static_cast<uint32_t>(i & 1));
        const float alpha[2] = {alpha_shared[warp_rows], alpha_shared[warp_rows + 8]};
        if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
          for (int r = 0; r < 128; ++r)
            o[r] *= alpha[(r / 2) % 2];
        }
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kTile / 16; ++k) {
          wgmma_m64n256k16(
              o, wgmma_descriptor_advance(p_scores, scores_operand(k, kHeads).start),
              wgmma_descriptor_advance(e_outputs, outputs_operand(1, k, kTile).start - half_start));
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_accumulators(o);
        if (i + 1 < count) mbarrier_arrive(barriers.p_free);
        if (i + 2 < count) release_stage(stage);
      }
      mbarrier_wait(barriers.registers_back, 0);
      raise_registers<kLaunchRegisters>();
    }
  }
  // Every warpgroup is back at the launch's register count, so the three finish in one place
  // (one set of CTA and cluster barriers, reached by every thread from the same code).
  finish_row<kSparsePipelinedThreads, kPartials>(p, plan, space, n, tid,
                                                 warpgroup < 2 ? warpgroup : -1, warpgroup == 0, o,
                                                 row_max, row_sum, out_vector, kSharedConversion);
}

// The instances for one place of the partial results.
template <SparsePartials kPartials>
TensorCoreKernel pipelined_instance(bool wide, bool shared_conversion) {
  if (shared_conversion) {
    return wide ? sparse_decode_pipelined_kernel<true, true, kPartials>
                : sparse_decode_pipelined_kernel<false, true, kPartials>;
  }
  return wide ? sparse_decode_pipelined_kernel<true, false, kPartials>
              : sparse_decode_pipelined_kernel<false, false, kPartials>;
}

}  // namespace

TensorCoreKernel sparse_decode_pipelined_instance(bool wide, bool shared_conversion,
                                                  SparsePartials partials) {
  switch (partials) {
    case SparsePartials::kFp32Records:
      return pipelined_instance<SparsePartials::kFp32Records>(wide, shared_conversion);
    case SparsePartials::kBf16Records:
      return pipelined_instance<SparsePartials::kBf16Records>(wide, shared_conversion);
    case SparsePartials::kInCluster:
      break;
  }
  return pipelined_instance<SparsePartials::kInCluster>(wide, shared_conversion);
}

int sparse_decode_pipelined_shared_bytes() {
  return kPipelinedSharedBytes;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
