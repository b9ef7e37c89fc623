// hdk-bench attention: the DeepSeek-V4 read side on the decode path. sparse_decode over the
// Flash (Hq = 64) and Pro (Hq = 128) lists, each query reading its own entries (a CSA list of
// top-k compressed slots or an HCA list of every compressed slot in the compressed pool, plus its
// own SWA ring page in a separate ring tensor, as hdk.dsv4.KVCacheManager keeps them), and
// index_topk over MXFP4 or FP8 key pages (--formats), each query scoring its own request's keys.
// Times are CUDA-graph replays with caches flushed before each (see bench_device.h); %copy = the KV
// (or key) bytes read / time against the copy bandwidth measured in the same run. --verify checks
// the points small enough against the float64 reference with the tests' tolerances.
//
// The pages are filled with random bytes that are valid data (finite FP8 codes, bf16 RoPE values
// of moderate size, scale bytes in a narrow range) instead of running the store on the host: a
// 262144-key x 64-row point is over a GiB of keys, and the kernels read bytes, not their history.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "bench_device.h"
#include "core/float_convert.h"
#include "dsv4/attention/reference/attention_reference.h"
#include "dsv4_bench_data.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"

#ifdef HDK_WITH_CUDA
#include "core/cuda_helpers.h"
#include "dsv4/attention/attention_validation.h"
#include "dsv4/index_topk/cuda/index_topk_cuda.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_cuda.h"
#endif

namespace hdk {
namespace bench {
namespace {

struct AttentionPreset {
  const char* name;
  int64_t heads;       // query heads of sparse_decode
  int64_t csa_length;  // compressed entries of a CSA list: the indexer's top-k
};

const AttentionPreset kAttentionPresets[] = {{"flash", 64, 512}, {"pro", 128, 1024}};

constexpr int64_t kWindow = 128;  // SWA entries per query: one ring page of 128
constexpr int64_t kHcaLength =
    4096;                           // long-context HCA list: 4096 compressed entries (512K tokens)
constexpr int64_t kBlockSize = 64;  // pages of the compressed pool and of the key cache

// The compressed entries of an HCA list named `hca` (kHcaLength) or `hcaE` (E entries, e.g. hca512
// for a 65536-token context), 0 for any other name.
int64_t hca_entries(const std::string& list) {
  if (list == "hca") return kHcaLength;
  if (list.size() <= 3 || list.compare(0, 3, "hca") != 0) return 0;
  int64_t entries = 0;
  for (size_t i = 3; i < list.size(); ++i) {
    if (list[i] < '0' || list[i] > '9' || entries > (int64_t{1} << 40)) return 0;
    entries = 10 * entries + (list[i] - '0');
  }
  return entries;
}

// The index_topk forms a point can take: the keys' format and the query's form.
struct IndexForm {
  const char* name;
  dsv4::KeyFormat format;
  int64_t key_bytes;
  bool packed_query;  // packed E2M1 q with UE8M0 scales (else exact, or E4M3 with FP8 keys)
  DType exact_q = DType::kBFloat16;  // the exact q's dtype
};

// mxfp4: exact bf16 q over MXFP4 keys (the contract's default); mxfp4f32: exact fp32 q over
// MXFP4 keys; fp8: E4M3 q over FP8 keys (DeepGEMM's Hopper form); mxfp4q: packed E2M1 q with UE8M0
// scales over MXFP4 keys (the reference indexer's quantized query).
const IndexForm kIndexForms[] = {
    {"mxfp4", dsv4::KeyFormat::kMXFP4, dsv4::kMxfp4KeyBytes, false},
    {"mxfp4f32", dsv4::KeyFormat::kMXFP4, dsv4::kMxfp4KeyBytes, false, DType::kFloat32},
    {"fp8", dsv4::KeyFormat::kFP8, dsv4::kFp8KeyBytes, false},
    {"mxfp4q", dsv4::KeyFormat::kMXFP4, dsv4::kMxfp4KeyBytes, true}};

const IndexForm& find_index_form(const std::string& name) {
  for (const IndexForm& form : kIndexForms) {
    if (name == form.name) return form;
  }
  throw std::runtime_error("unknown key format '" + name + "' (mxfp4, mxfp4f32, fp8 or mxfp4q)");
}

struct Point {
  std::string op, preset, list;
  int64_t N = 0, length = 0, heads = 0, top_k = 0;
  double time_us = 0, bytes = 0;
  std::string kernel = "-", cluster = "-";  // sparse_decode: what ran, head groups x list splits
  std::string check = "-";
  std::string error;
};

// The tests' sparse_decode bounds (tests/dsv4/sparse_decode_test.cpp, docs/dsv4-attention.md
// "Accuracy") for bf16 out: |o - ref| <= 2^-8 |ref| + 1e-4 (1 + S) max|E|, |lse - ref| <=
// 1e-4 (1 + S). Returns "ok" or a short description of the first failure.
std::string check_sparse(const dsv4::SparseDecodeReference& ref, const std::vector<uint16_t>& out,
                         const std::vector<float>& lse, int64_t counter) {
  if (ref.invalid_rows != 0 || counter != 0) {
    return "FAIL (invalid rows: ref " + std::to_string(ref.invalid_rows) + ", counted " +
           std::to_string(counter) + ")";
  }
  const int64_t N = ref.num_rows, H = ref.num_heads, D = dsv4::kHeadDim;
  for (int64_t n = 0; n < N; ++n) {
    const double score_tol = 1e-4 * (1.0 + ref.score_magnitude[n]);
    const double value_tol = score_tol * ref.value_magnitude[n];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < D; ++i) {
        const size_t at = static_cast<size_t>((n * H + h) * D + i);
        const double want = ref.out[at];
        const double got = hdk::detail::bf16_to_float(out[at]);
        if (!(std::fabs(got - want) <= std::ldexp(1.0, -8) * std::fabs(want) + value_tol)) {
          return "FAIL (out[" + std::to_string(n) + "," + std::to_string(h) + "," +
                 std::to_string(i) + "] = " + std::to_string(got) + ", want " +
                 std::to_string(want) + ")";
        }
      }
      const double want = ref.lse[n * H + h];
      const double got = lse[n * H + h];
      if (!(std::fabs(got - want) <= score_tol)) {
        return "FAIL (lse[" + std::to_string(n) + "," + std::to_string(h) +
               "] = " + std::to_string(got) + ", want " + std::to_string(want) + ")";
      }
    }
  }
  return "ok";
}

// The tests' index_topk bounds: scores within 1e-5 x sum_h |w_h| sum_d |q_hd K_d| of the
// reference; the selection may differ from the reference's only among entries within those
// bounds of each other. Every row here has num_entries >= top_k, so no padding.
std::string check_index(const dsv4::IndexerReference& ref, const std::vector<int32_t>& indices,
                        const std::vector<float>& scores, int64_t counter) {
  if (ref.invalid_rows != 0 || counter != 0) return "FAIL (invalid rows)";
  const int64_t K = ref.top_k;
  for (int64_t n = 0; n < ref.num_rows; ++n) {
    const std::vector<double>& score = ref.scores[n];
    const auto count = static_cast<int64_t>(score.size());
    const int64_t kept = std::min(K, count);
    const std::string row = "row " + std::to_string(n) + ": ";
    std::vector<uint8_t> chosen(static_cast<size_t>(count), 0);
    double lowest = std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < K; ++j) {
      const int32_t s = indices[n * K + j];
      const float got = scores[n * K + j];
      if (j >= kept) {
        if (s != -1 || got != -std::numeric_limits<float>::infinity()) {
          return "FAIL (" + row + "padding at " + std::to_string(j) + ")";
        }
        continue;
      }
      if (s < 0 || s >= count || chosen[s]) {
        return "FAIL (" + row + "index " + std::to_string(s) + " at " + std::to_string(j) + ")";
      }
      chosen[s] = 1;
      const double tol = 1e-5 * ref.magnitudes[n][s] + 1e-30;
      lowest = std::min(lowest, score[s] + tol);
      if (!(std::fabs(got - score[s]) <= tol)) {
        return "FAIL (" + row + "score of entry " + std::to_string(s) + ")";
      }
      if (j > 0) {
        const float before = scores[n * K + j - 1];
        if (before < got || (before == got && indices[n * K + j - 1] > s)) {
          return "FAIL (" + row + "order at " + std::to_string(j) + ")";
        }
      }
    }
    for (int64_t s = 0; s < count; ++s) {
      if (!chosen[s] && score[s] - 1e-5 * ref.magnitudes[n][s] > lowest) {
        return "FAIL (" + row + "entry " + std::to_string(s) + " should have been chosen)";
      }
    }
  }
  return "ok";
}

class AttentionBench {
 public:
  AttentionBench(BenchDevice& device, const TimingOptions& timing, bool verify,
                 double verify_budget, bool workspace)
      : device_(device),
        timing_(timing),
        verify_(verify),
        verify_budget_(verify_budget),
        workspace_(workspace) {}

  // sparse_decode for N queries of `preset`, each over `compressed` entries of the compressed
  // pool plus its 128-entry ring page. CSA lists (spread > 1) pick `compressed` distinct entries
  // in random order out of the query's own spread x compressed entries, as a top-k does; HCA
  // lists (spread 1) read all the query's entries in order.
  Point sparse(const AttentionPreset& preset, const char* list, int64_t compressed, int64_t spread,
               int64_t N) {
    const int64_t H = preset.heads, D = dsv4::kHeadDim;
    std::mt19937_64 rng(static_cast<uint64_t>(N * 1009 + compressed * 7 + H));
    FastRandom random(static_cast<uint64_t>(N * 31 + compressed));
    const int64_t pool_entries = compressed * spread;
    const int64_t pages_per_row = (pool_entries + kBlockSize - 1) / kBlockSize;
    const int64_t num_blocks = std::max<int64_t>(N * pages_per_row, 1);
    std::vector<uint8_t> cache, ring;
    fill_entry_pages(cache, num_blocks, kBlockSize, random);
    fill_entry_pages(ring, std::max<int64_t>(N, 1), kWindow, random);
    const std::vector<int32_t> blocks = shuffled_blocks(num_blocks, rng);
    const std::vector<int32_t> ring_pages = shuffled_blocks(std::max<int64_t>(N, 1), rng);
    std::vector<int32_t> indices(static_cast<size_t>(N * compressed));
    std::vector<int32_t> extra(static_cast<size_t>(N * kWindow));
    std::vector<int32_t> ordinals(static_cast<size_t>(pool_entries));
    for (int64_t n = 0; n < N; ++n) {
      std::iota(ordinals.begin(), ordinals.end(), 0);
      if (spread > 1) {  // a random subset in random order (partial Fisher-Yates)
        for (int64_t j = 0; j < compressed; ++j)
          std::swap(ordinals[j], ordinals[j + rng() % static_cast<uint64_t>(pool_entries - j)]);
      }
      for (int64_t j = 0; j < compressed; ++j) {
        const int64_t s = ordinals[j];
        indices[n * compressed + j] = static_cast<int32_t>(
            blocks[n * pages_per_row + s / kBlockSize] * kBlockSize + s % kBlockSize);
      }
      // The window in position order: list entry j is position p-127+j, stored at ring slot
      // (p+1+j) % 128; start = (p+1) % 128 for a random p.
      const int64_t start = static_cast<int64_t>(rng() % kWindow);
      for (int64_t j = 0; j < kWindow; ++j)
        extra[n * kWindow + j] =
            static_cast<int32_t>(ring_pages[n] * kWindow + (start + j) % kWindow);
    }
    std::vector<uint16_t> q = normal_bf16(rng, N * H * D, 1.0f);
    std::vector<float> sink = normal_floats(rng, H, 2.0f);

    DeviceAllocation d_cache(device_, cache.size()), d_ring(device_, ring.size()),
        d_indices(device_, indices.size() * 4), d_extra(device_, extra.size() * 4),
        d_q(device_, q.size() * 2), d_sink(device_, sink.size() * 4), d_out(device_, N * H * D * 2),
        d_lse(device_, N * H * 4), d_counter(device_, 4);
    device_.upload(d_cache.get(), cache.data(), cache.size());
    device_.upload(d_ring.get(), ring.data(), ring.size());
    device_.upload(d_indices.get(), indices.data(), indices.size() * 4);
    device_.upload(d_extra.get(), extra.data(), extra.size() * 4);
    device_.upload(d_q.get(), q.data(), q.size() * 2);
    device_.upload(d_sink.get(), sink.data(), sink.size() * 4);
    const Device where = device_.device();
    dsv4::SparseDecodeParams p;
    p.q = TensorView::contiguous(d_q.get(), DType::kBFloat16, {N, H, D}, where);
    p.cache = TensorView::contiguous(d_cache.get(), DType::kUInt8,
                                     {num_blocks, kBlockSize * dsv4::kEntryBytes}, where);
    p.block_size = kBlockSize;
    p.indices = TensorView::contiguous(d_indices.get(), DType::kInt32, {N, compressed}, where);
    p.extra_cache = TensorView::contiguous(
        d_ring.get(), DType::kUInt8, {std::max<int64_t>(N, 1), kWindow * dsv4::kEntryBytes}, where);
    p.extra_block_size = kWindow;
    p.extra_indices = TensorView::contiguous(d_extra.get(), DType::kInt32, {N, kWindow}, where);
    p.sink = TensorView::contiguous(d_sink.get(), DType::kFloat32, {H}, where);
    p.out = TensorView::contiguous(d_out.get(), DType::kBFloat16, {N, H, D}, where);
    p.lse = TensorView::contiguous(d_lse.get(), DType::kFloat32, {N, H}, where);
    // The workspace an engine allocates once for this shape (none on the CPU).
    const int64_t workspace_bytes =
        workspace_ ? dsv4::sparse_decode_workspace_bytes(N, H, kWindow + compressed, where) : 0;
    DeviceAllocation d_workspace(device_,
                                 static_cast<size_t>(std::max<int64_t>(workspace_bytes, 1)));
    if (workspace_bytes > 0) {
      p.workspace =
          TensorView::contiguous(d_workspace.get(), DType::kUInt8, {workspace_bytes}, where);
    }

    Point point;
    point.op = "sparse_decode";
    point.preset = preset.name;
    point.list = list;
    point.N = N;
    point.length = kWindow + compressed;
    point.heads = H;
    point.bytes = static_cast<double>(N) * point.length * dsv4::kEntryBytes;
    const double work = static_cast<double>(N) * H * point.length * D;
    if (verify_ && work <= verify_budget_) {
      const int32_t zero = 0;
      device_.upload(d_counter.get(), &zero, 4);
      dsv4::SparseDecodeParams counted = p;
      counted.invalid_count = TensorView::contiguous(d_counter.get(), DType::kInt32, {1}, where);
      dsv4::sparse_decode(counted);
      std::vector<uint16_t> out(static_cast<size_t>(N * H * D));
      std::vector<float> lse(static_cast<size_t>(N * H));
      int32_t counter = 0;
      device_.download(out.data(), d_out.get(), out.size() * 2);
      device_.download(lse.data(), d_lse.get(), lse.size() * 4);
      device_.download(&counter, d_counter.get(), 4);
      dsv4::SparseDecodeParams host = p;
      host.q = TensorView::contiguous(q.data(), DType::kBFloat16, {N, H, D});
      host.cache = TensorView::contiguous(cache.data(), DType::kUInt8,
                                          {num_blocks, kBlockSize * dsv4::kEntryBytes});
      host.indices = TensorView::contiguous(indices.data(), DType::kInt32, {N, compressed});
      host.extra_cache = TensorView::contiguous(
          ring.data(), DType::kUInt8, {std::max<int64_t>(N, 1), kWindow * dsv4::kEntryBytes});
      host.extra_indices = TensorView::contiguous(extra.data(), DType::kInt32, {N, kWindow});
      host.sink = TensorView::contiguous(sink.data(), DType::kFloat32, {H});
      std::vector<uint8_t> scratch(static_cast<size_t>(N * H * D * 2 + N * H * 4));
      host.out = TensorView::contiguous(scratch.data(), DType::kBFloat16, {N, H, D});
      host.lse = TensorView::contiguous(scratch.data() + N * H * D * 2, DType::kFloat32, {N, H});
      point.check = check_sparse(dsv4::sparse_decode_reference(host), out, lse, counter);
    } else {
      dsv4::sparse_decode(p);  // errors surface here, not inside a graph capture
    }
#ifdef HDK_WITH_CUDA
    if (where.type == Device::Type::kCUDA) {
      const dsv4::detail::SparseLaunchReport launch = dsv4::detail::sparse_decode_launch_report(
          dsv4::detail::validate_sparse_decode(p), where.index);
      point.kernel = launch.kernel;
      // groups x splits, then the heads of a group where they are fewer than 64.
      const bool small_groups = launch.plan.group_heads < dsv4::detail::kSparseGroupHeads;
      point.cluster = std::to_string(launch.plan.groups) + "x" +
                      std::to_string(launch.plan.splits) +
                      (launch.plan.through_workspace ? " ws" : "") +
                      (small_groups ? " h" + std::to_string(launch.plan.group_heads) : "");
    }
#endif
    point.time_us = device_.time_us([&](CudaStream s) { dsv4::sparse_decode(p, s); }, timing_);
    return point;
  }

  // Inputs of index_topk points: N rows, each scoring `entries` keys of its own pages.
  struct IndexInputs {
    const IndexForm* form = nullptr;
    int64_t N = 0, entries = 0, pages_per_row = 0, num_blocks = 0;
    std::vector<uint8_t> cache;
    std::vector<uint8_t>
        q;  // bf16 (mxfp4), fp32 (mxfp4f32), E4M3 codes (fp8), packed E2M1 (mxfp4q)
    std::vector<uint8_t> q_scales;  // mxfp4q: UE8M0 bytes [N, H, 4]
    std::vector<float> weights;
    std::vector<int32_t> block_table, num_entries;
    std::unique_ptr<DeviceAllocation> d_cache, d_q, d_q_scales, d_weights, d_table, d_counts;
  };

  std::unique_ptr<IndexInputs> index_inputs(const IndexForm& form, int64_t N, int64_t entries) {
    auto in = std::make_unique<IndexInputs>();
    std::mt19937_64 rng(static_cast<uint64_t>(N * 4099 + entries));
    FastRandom random(static_cast<uint64_t>(N * 17 + entries));
    in->form = &form;
    in->N = N;
    in->entries = entries;
    in->pages_per_row = (entries + kBlockSize - 1) / kBlockSize;
    in->num_blocks = std::max<int64_t>(N * in->pages_per_row, 1);
    const int64_t q_values = N * dsv4::kIndexerHeads * dsv4::kIndexerKeyDim;
    if (form.format == dsv4::KeyFormat::kFP8) {
      fill_fp8_key_pages(in->cache, in->num_blocks, kBlockSize, random);
      in->q = random_e4m3(q_values, random);
    } else {
      fill_key_pages(in->cache, in->num_blocks, kBlockSize, random);
      if (form.packed_query) {
        in->q.resize(static_cast<size_t>(q_values / 2));
        for (uint8_t& byte : in->q)
          byte = static_cast<uint8_t>(random.next() >> 32);
        in->q_scales.resize(static_cast<size_t>(q_values / 32));
        for (uint8_t& byte : in->q_scales)
          byte = static_cast<uint8_t>(124 + random.below(7));
      } else if (form.exact_q == DType::kFloat32) {
        const std::vector<float> q = normal_floats(rng, q_values, 1.0f);
        in->q.resize(q.size() * 4);
        std::memcpy(in->q.data(), q.data(), in->q.size());
      } else {
        const std::vector<uint16_t> q = normal_bf16(rng, q_values, 1.0f);
        in->q.resize(q.size() * 2);
        std::memcpy(in->q.data(), q.data(), in->q.size());
      }
    }
    in->block_table = shuffled_blocks(in->num_blocks, rng);
    in->block_table.resize(static_cast<size_t>(N * in->pages_per_row));
    in->num_entries.assign(static_cast<size_t>(N), static_cast<int32_t>(entries));
    in->weights = normal_floats(rng, N * dsv4::kIndexerHeads, 0.1f);
    auto make = [&](size_t bytes, const void* host) {
      auto allocation = std::make_unique<DeviceAllocation>(device_, bytes);
      if (bytes > 0) device_.upload(allocation->get(), host, bytes);
      return allocation;
    };
    in->d_cache = make(in->cache.size(), in->cache.data());
    in->d_q = make(in->q.size(), in->q.data());
    in->d_q_scales = make(in->q_scales.size(), in->q_scales.data());
    in->d_weights = make(in->weights.size() * 4, in->weights.data());
    in->d_table = make(in->block_table.size() * 4, in->block_table.data());
    in->d_counts = make(in->num_entries.size() * 4, in->num_entries.data());
    return in;
  }

  // `workspace`: pass one of index_topk_workspace_bytes, allocated once for the point.
  Point index(IndexInputs& in, const char* preset, int64_t top_k, bool workspace) {
    const int64_t N = in.N, H = dsv4::kIndexerHeads, K = top_k;
    const Device where = device_.device();
    DeviceAllocation d_indices(device_, N * K * 4), d_slots(device_, N * K * 4),
        d_scores(device_, N * K * 4), d_counter(device_, 4);
    const int64_t workspace_bytes =
        workspace ? dsv4::index_topk_workspace_bytes(N, in.pages_per_row * kBlockSize, where) : 0;
    DeviceAllocation d_workspace(device_, static_cast<size_t>(workspace_bytes));
    const IndexForm& form = *in.form;
    // The query as the form takes it, over host or device bytes.
    auto query = [&](void* q, void* scales, dsv4::IndexerParams& params, Device at) {
      if (form.format == dsv4::KeyFormat::kFP8) {
        params.q = TensorView::contiguous(q, DType::kUInt8, {N, H, dsv4::kIndexerKeyDim}, at);
      } else if (form.packed_query) {
        params.q = TensorView::contiguous(q, DType::kUInt8, {N, H, dsv4::kIndexerKeyDim / 2}, at);
        params.q_scales = TensorView::contiguous(scales, DType::kUInt8, {N, H, 4}, at);
      } else {
        params.q = TensorView::contiguous(q, form.exact_q, {N, H, dsv4::kIndexerKeyDim}, at);
      }
    };
    dsv4::IndexerParams p;
    query(in.d_q->get(), in.d_q_scales->get(), p, where);
    p.weights = TensorView::contiguous(in.d_weights->get(), DType::kFloat32, {N, H}, where);
    p.key_cache = TensorView::contiguous(in.d_cache->get(), DType::kUInt8,
                                         {in.num_blocks, kBlockSize * form.key_bytes}, where);
    p.block_size = kBlockSize;
    p.format = form.format;
    p.block_table =
        TensorView::contiguous(in.d_table->get(), DType::kInt32, {N, in.pages_per_row}, where);
    p.num_entries = TensorView::contiguous(in.d_counts->get(), DType::kInt32, {N}, where);
    p.top_k = K;
    p.topk_indices = TensorView::contiguous(d_indices.get(), DType::kInt32, {N, K}, where);
    // The selected entries' slots as well: sparse_decode's list, what an engine asks for.
    p.topk_slots = TensorView::contiguous(d_slots.get(), DType::kInt32, {N, K}, where);
    if (workspace_bytes > 0) {
      p.workspace =
          TensorView::contiguous(d_workspace.get(), DType::kUInt8, {workspace_bytes}, where);
    }

    Point point;
    point.op = "index_topk";
    point.preset = preset;
    point.list = form.name;
    point.N = N;
    point.length = in.entries;
    point.heads = H;
    point.top_k = K;
    point.bytes = static_cast<double>(N) * in.entries * form.key_bytes;
    const double work = static_cast<double>(N) * in.entries * H * dsv4::kIndexerKeyDim;
    if (verify_ && work <= verify_budget_) {
      const int32_t zero = 0;
      device_.upload(d_counter.get(), &zero, 4);
      dsv4::IndexerParams checked = p;
      checked.topk_scores = TensorView::contiguous(d_scores.get(), DType::kFloat32, {N, K}, where);
      checked.invalid_count = TensorView::contiguous(d_counter.get(), DType::kInt32, {1}, where);
      dsv4::index_topk(checked);
      std::vector<int32_t> indices(static_cast<size_t>(N * K));
      std::vector<float> scores(static_cast<size_t>(N * K));
      int32_t counter = 0;
      std::vector<int32_t> slots(static_cast<size_t>(N * K));
      device_.download(indices.data(), d_indices.get(), indices.size() * 4);
      device_.download(slots.data(), d_slots.get(), slots.size() * 4);
      device_.download(scores.data(), d_scores.get(), scores.size() * 4);
      device_.download(&counter, d_counter.get(), 4);
      dsv4::IndexerParams host = p;
      query(in.q.data(), in.q_scales.data(), host, Device::cpu());
      host.weights = TensorView::contiguous(in.weights.data(), DType::kFloat32, {N, H});
      host.key_cache = TensorView::contiguous(in.cache.data(), DType::kUInt8,
                                              {in.num_blocks, kBlockSize * form.key_bytes});
      host.block_table =
          TensorView::contiguous(in.block_table.data(), DType::kInt32, {N, in.pages_per_row});
      host.num_entries = TensorView::contiguous(in.num_entries.data(), DType::kInt32, {N});
      std::vector<int32_t> scratch(static_cast<size_t>(N * K));
      host.topk_indices = TensorView::contiguous(scratch.data(), DType::kInt32, {N, K});
      host.topk_slots = TensorView();  // p's points at device memory; checked below instead
      point.check = check_index(dsv4::index_topk_reference(host), indices, scores, counter);
      for (int64_t at = 0; at < N * K && point.check == "ok"; ++at) {
        const int32_t s = indices[at];
        const int32_t want =
            s < 0 ? -1
                  : in.block_table[(at / K) * in.pages_per_row + s / kBlockSize] * kBlockSize +
                        s % kBlockSize;
        if (slots[at] != want) point.check = "FAIL (topk_slots[" + std::to_string(at) + "])";
      }
    } else {
      dsv4::index_topk(p);  // errors surface here, not inside a graph capture
    }
#ifdef HDK_WITH_CUDA
    if (where.type == Device::Type::kCUDA) {
      const dsv4::detail::IndexLaunchReport launch =
          dsv4::detail::index_topk_launch_report(dsv4::detail::validate_index_topk(p), where.index);
      point.kernel = launch.segments == 0 ? "cluster" : launch.key_ring ? "ring" : "workspace";
      // Scoring CTAs / the select's CTAs a row ("1 CTA": the select's one-CTA kernel).
      point.cluster =
          (launch.segments > 0 ? std::to_string(launch.segments) : std::string("-")) + "/" +
          (launch.select_in_one_cta ? std::string("1 CTA") : std::to_string(launch.cluster_size));
    }
#endif
    point.time_us = device_.time_us([&](CudaStream s) { dsv4::index_topk(p, s); }, timing_);
    return point;
  }

 private:
  BenchDevice& device_;
  TimingOptions timing_;
  bool verify_;
  double verify_budget_;
  bool workspace_;
};

void print_attention_usage() {
  std::printf(
      "hdk-bench attention [options]\n"
      "  --preset flash,pro    Hq 64, CSA top-512 / Hq 128, CSA top-1024 (index_topk: top_k)\n"
      "  --ops LIST            sparse,index (default both)\n"
      "  --lists LIST          sparse_decode lists: csa (128 + top-k), hca (128 + 4096),\n"
      "                        hcaE (128 + E, e.g. hca512: a 65536-token context)\n"
      "  --N LIST              sparse_decode queries (default 1-128 GPU, 1,2 CPU)\n"
      "  --csa-spread S        a CSA list picks its entries out of S x top-k of the query's own\n"
      "                        (default 4); an HCA list reads all of its own\n"
      "  --index-N LIST        index_topk rows (default 1,4,16,64 GPU, 1 CPU)\n"
      "  --entries LIST        index_topk keys per row (default 8192,65536,262144 GPU, 8192 CPU)\n"
      "  --formats LIST        index_topk forms: mxfp4 (bf16 q, the default), mxfp4f32 (fp32\n"
      "                        q), fp8 (E4M3 q over FP8 keys), mxfp4q (packed E2M1 q with\n"
      "                        UE8M0 scales)\n"
      "  --hot                 keep caches warm between runs (default: flushed, cold)\n"
      "  --flush-code          also evict the SMs' instruction caches before each run (the\n"
      "                        L2 flush leaves them holding the last replay's code)\n"
      "  --iterations N        timed runs per point (median)\n"
      "  --verify              check points up to the budget against the float64 reference\n"
      "  --verify-budget X     largest N*Hq*L*512 (sparse) or N*entries*64*128 (index) checked\n"
      "                        (default 1073741824)\n"
      "  --json FILE           also write results as JSON\n"
      "  --splits S            sparse_decode on tensor cores: S list splits per row (tuning;\n"
      "                        rounded down to what the cluster and the list allow)\n"
      "  --workspace W         on (default): pass each call the workspace an engine would\n"
      "                        allocate (sparse_decode_workspace_bytes, "
      "index_topk_workspace_bytes:\n"
      "                        few rows over every SM); off: none (a row stays in one cluster);\n"
      "                        always: sparse_decode splits every row through it where it can\n"
      "  --pdl on|off          launch every kernel as a programmatic dependent of the one\n"
      "                        before it (on, the default; off: plain launches)\n"
      "  --sparse-kernel K     sparse_decode on tensor cores: auto (the dispatcher's: pipelined,\n"
      "                        but one or two tiles a CTA through the workspace where those\n"
      "                        CTAs fit one wave), mma (without warp specialization) or pipelined\n"
      "                        (warp-specialized where a CTA walks 3+ tiles, mma elsewhere),\n"
      "                        pipelined-always (warp-specialized whatever a CTA walks)\n"
      "  --index-kernel K      index_topk on tensor cores: auto (warpgroups up to 64 heads) or\n"
      "                        warp (the mma.sync kernel at any head count; comparison)\n"
      "  --index-ring R        index_topk's MXFP4 keys through the scoring kernel's key ring in\n"
      "                        shared memory: auto (the plan's), never (from registers) or\n"
      "                        always (wherever the workspace holds the rows, every row\n"
      "                        streaming; comparison)\n"

      "  --cpu                 run on the CPU even when a GPU is present\n");
}

const AttentionPreset& find_preset(const std::string& name) {
  for (const AttentionPreset& preset : kAttentionPresets) {
    if (name == preset.name) return preset;
  }
  throw std::runtime_error("unknown preset '" + name + "' (flash or pro)");
}

}  // namespace

int attention_command(Options& options) {
  if (options.flag("help")) {
    print_attention_usage();
    return 0;
  }
  std::unique_ptr<BenchDevice> device = BenchDevice::create(options.flag("cpu"));
  const bool gpu = device->device().is_cuda();
  const std::vector<std::string> presets = options.texts("preset", {"flash", "pro"});
  const std::vector<std::string> ops = options.texts("ops", {"sparse", "index"});
  const std::vector<std::string> lists = options.texts("lists", {"csa", "hca"});
  const std::vector<int64_t> rows = options.integers(
      "N", gpu ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128} : std::vector<int64_t>{1, 2});
  const int64_t spread = options.integer("csa-spread", 4);
  const std::vector<int64_t> index_rows = options.integers(
      "index-N", gpu ? std::vector<int64_t>{1, 4, 16, 64} : std::vector<int64_t>{1});
  const std::vector<int64_t> entry_counts = options.integers(
      "entries", gpu ? std::vector<int64_t>{8192, 65536, 262144} : std::vector<int64_t>{8192});
  const std::vector<std::string> formats = options.texts("formats", {"mxfp4"});
  const bool verify = options.flag("verify");
  const double verify_budget = options.real("verify-budget", 1073741824.0);
  TimingOptions timing;
  timing.flush_cache = !options.flag("hot");
  timing.flush_code = options.flag("flush-code");
  timing.iterations = static_cast<int>(options.integer("iterations", gpu ? 100 : 3));
  const std::string json_path = options.text("json", "");
  const int64_t forced_splits = options.integer("splits", 0);
  const std::string index_kernel = options.text("index-kernel", "auto");
  const std::string index_ring = options.text("index-ring", "auto");
  const std::string sparse_kernel = options.text("sparse-kernel", "auto");
  const std::string workspace = options.text("workspace", "on");
  const std::string dependent = options.text("pdl", "on");
  options.reject_unused();
  if (dependent != "on" && dependent != "off") {
    throw std::runtime_error("--pdl must be on or off, got '" + dependent + "'");
  }
  if (workspace != "on" && workspace != "off" && workspace != "always") {
    throw std::runtime_error("--workspace must be on, off or always, got '" + workspace + "'");
  }
  if (forced_splits < 0) throw std::runtime_error("--splits must be at least 1");
  if (index_kernel != "auto" && index_kernel != "warp") {
    throw std::runtime_error("--index-kernel must be auto or warp, got '" + index_kernel + "'");
  }
  if (index_ring != "auto" && index_ring != "never" && index_ring != "always") {
    throw std::runtime_error("--index-ring must be auto, never or always, got '" + index_ring +
                             "'");
  }
  if (sparse_kernel != "auto" && sparse_kernel != "mma" && sparse_kernel != "pipelined" &&
      sparse_kernel != "pipelined-always") {
    throw std::runtime_error(
        "--sparse-kernel must be auto, mma, pipelined or pipelined-always, got '" + sparse_kernel +
        "'");
  }
#ifdef HDK_WITH_CUDA
  dsv4::detail::set_sparse_decode_splits_override(static_cast<int>(forced_splits));
  hdk::detail::set_dependent_launch(dependent == "on");
  dsv4::detail::set_sparse_decode_workspace_override(
      workspace == "always" ? dsv4::detail::SparseWorkspaceChoice::kAlways
                            : dsv4::detail::SparseWorkspaceChoice::kAuto);
  dsv4::detail::set_index_score_path(index_kernel == "warp"
                                         ? dsv4::detail::IndexScorePath::kWarpMma
                                         : dsv4::detail::IndexScorePath::kTensorCore);
  dsv4::detail::set_index_key_ring_override(
      index_ring == "never"    ? dsv4::detail::IndexKeyRingChoice::kNever
      : index_ring == "always" ? dsv4::detail::IndexKeyRingChoice::kAlways
                               : dsv4::detail::IndexKeyRingChoice::kAuto);
  dsv4::detail::set_sparse_decode_kernel_override(
      sparse_kernel == "mma"         ? dsv4::detail::SparseDecodeKernel::kTensorCore
      : sparse_kernel == "pipelined" ? dsv4::detail::SparseDecodeKernel::kTensorCorePipelined
      : sparse_kernel == "pipelined-always"
          ? dsv4::detail::SparseDecodeKernel::kTensorCorePipelinedEveryCall
          : dsv4::detail::SparseDecodeKernel::kAuto);
#else
  if (forced_splits != 0) throw std::runtime_error("--splits needs the CUDA backend");
  if (index_kernel != "auto") throw std::runtime_error("--index-kernel needs the CUDA backend");
  if (index_ring != "auto") throw std::runtime_error("--index-ring needs the CUDA backend");
  if (sparse_kernel != "auto") throw std::runtime_error("--sparse-kernel needs the CUDA backend");
#endif
  for (const std::string& op : ops) {
    if (op != "sparse" && op != "index") throw std::runtime_error("unknown op '" + op + "'");
  }
  for (const std::string& list : lists) {
    if (list != "csa" && hca_entries(list) <= 0) {
      throw std::runtime_error("unknown list '" + list + "' (csa, hca or hcaE, E > 0 entries)");
    }
  }
  for (const std::string& name : presets)
    find_preset(name);  // an unknown name fails before the run starts
  for (const std::string& name : formats)
    find_index_form(name);
  if (spread < 1) throw std::runtime_error("--csa-spread must be at least 1");
  for (int64_t n : rows) {
    if (n < 1) throw std::runtime_error("--N values must be at least 1");
  }
  for (int64_t n : index_rows) {
    if (n < 1) throw std::runtime_error("--index-N values must be at least 1");
  }
  for (int64_t e : entry_counts) {
    if (e < 1) throw std::runtime_error("--entries values must be at least 1");
  }

  const RunBaseline baseline = start_run(*device, "attention", timing);
  ResultTable table({"op", "preset", "list", "N", "L", "Hq", "top_k", "kernel", "cluster",
                     "time_us", "GB/s", "%copy", "floor_us", "x_floor", "target", "check"});
  AttentionBench bench(*device, timing, verify, verify_budget, workspace != "off");
  int failures = 0;
  auto add = [&](const Point& point) {
    std::string L = point.op == "sparse_decode"
                        ? std::to_string(kWindow) + "+" + std::to_string(point.length - kWindow)
                        : std::to_string(point.length);
    std::vector<std::string> cells = {point.op,
                                      point.preset,
                                      point.list,
                                      std::to_string(point.N),
                                      L,
                                      std::to_string(point.heads),
                                      point.top_k ? std::to_string(point.top_k) : "-",
                                      point.kernel,
                                      point.cluster};
    if (!point.error.empty()) {
      ++failures;
      cells.insert(cells.end(), {"error", "-", "-", "-", "-", "-", "error"});
      table.add_row(cells);
      return;
    }
    const double gbs = point.bytes / (point.time_us * 1e-6) / 1e9;
    const double percent = 100.0 * gbs / baseline.copy_gbs;
    // The targets: sparse_decode >= 75% of copy at N >= 32, index_topk >= 70% at 65536+.
    std::string target = "-";
    if (point.op == "sparse_decode" && point.N >= 32) target = percent >= 75.0 ? "met" : "MISSED";
    if (point.op == "index_topk" && point.length >= 65536) {
      target = percent >= 70.0 ? "met" : "MISSED";
    }
    if (point.check.rfind("FAIL", 0) == 0) {
      ++failures;
      std::fprintf(stderr, "%s %s %s N=%lld: %s\n", point.op.c_str(), point.preset.c_str(),
                   point.list.c_str(), static_cast<long long>(point.N), point.check.c_str());
    }
    // What no kernel can beat: one launch, then the bytes at the copy bandwidth.
    const double floor_us = baseline.launch_overhead_us + point.bytes / (baseline.copy_gbs * 1e3);
    cells.insert(cells.end(), {format(point.time_us, 2), format(gbs, 1), format(percent, 1),
                               format(floor_us, 2), format(point.time_us / floor_us, 2), target,
                               point.check.rfind("FAIL", 0) == 0 ? "FAIL" : point.check});
    table.add_row(cells);
  };
  // One failing point (e.g. a backend that throws) is reported and the run goes on.
  auto attempt = [&](Point base, const std::function<Point()>& run) {
    try {
      add(run());
    } catch (const std::exception& error) {
      std::fprintf(stderr, "%s %s %s N=%lld: %s\n", base.op.c_str(), base.preset.c_str(),
                   base.list.c_str(), static_cast<long long>(base.N), error.what());
      base.error = error.what();
      add(base);
    }
  };
  auto has = [&](const char* op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
  if (has("sparse")) {
    for (const std::string& name : presets) {
      const AttentionPreset& preset = find_preset(name);
      for (const std::string& list : lists) {
        const bool csa = list == "csa";
        const int64_t compressed = csa ? preset.csa_length : hca_entries(list);
        for (int64_t N : rows) {
          std::fprintf(stderr, "\rsparse_decode %s %s N=%lld ...   ", preset.name, list.c_str(),
                       static_cast<long long>(N));
          Point base;
          base.op = "sparse_decode";
          base.preset = preset.name;
          base.list = list;
          base.N = N;
          base.length = kWindow + compressed;
          base.heads = preset.heads;
          attempt(base, [&] {
            return bench.sparse(preset, list.c_str(), compressed, csa ? spread : 1, N);
          });
        }
      }
    }
  }
  if (has("index")) {
    for (int64_t N : index_rows) {
      for (int64_t entries : entry_counts) {
        for (const std::string& format : formats) {
          const IndexForm& form = find_index_form(format);
          std::fprintf(stderr, "\rindex_topk %s N=%lld entries=%lld ...   ", form.name,
                       static_cast<long long>(N), static_cast<long long>(entries));
          std::unique_ptr<AttentionBench::IndexInputs> inputs;
          for (const std::string& name : presets) {
            const AttentionPreset& preset = find_preset(name);
            Point base;
            base.op = "index_topk";
            base.preset = preset.name;
            base.list = form.name;
            base.N = N;
            base.length = entries;
            base.heads = dsv4::kIndexerHeads;
            base.top_k = preset.csa_length;
            attempt(base, [&] {
              if (!inputs) inputs = bench.index_inputs(form, N, entries);
              return bench.index(*inputs, preset.name, preset.csa_length, workspace != "off");
            });
          }
        }
      }
    }
  }
  std::fprintf(stderr, "\r%60s\r", "");
  return finish_run(
      table,
      "GB/s = KV bytes read / time. sparse_decode: N x L x 584 (every query reads its own L ="
      "\n128 SWA entries of its ring page + the compressed entries: CSA top-k picked out of"
      "\n--csa-spread x top-k of its own, HCA all of its own: 4096, or E for hcaE); not counted: q "
      "and out"
      "\n(N x Hq x 512 bf16 each), lse, sink and the int32 indices (N x L x 4)."
      "\nindex_topk: N x entries x 68 (MXFP4 keys of the row's own pages, block size 64; list"
      "\nmxfp4 with bf16 q, mxfp4f32 with fp32 q, mxfp4q with packed E2M1 q) or x 132 (list"
      "\nfp8: FP8 keys, E4M3 q);"
      "\nnot counted: q (N x 64 x 128 values), weights, block table, the top-k indices and"
      "\nslots written (timed with topk_slots, without topk_scores). %copy = GB/s / copy bw."
      "\nkernel, cluster (sparse_decode on CUDA): the kernel that ran (pipelined, mma or simple)"
      "\nand its row cluster, head groups x list splits ('ws': the splits are combined through"
      "\nthe workspace by a second kernel instead of inside one cluster)."
      "\nkernel, cluster (index_topk on CUDA): workspace (scoring CTAs over every SM, then a"
      "\nselect; --workspace on), ring (the same, the scoring streaming the keys through its"
      "\nkey ring in shared memory) or cluster (one launch), and scoring CTAs / select cluster a"
      "\nrow."
      "\nfloor_us = one empty-kernel graph replay + bytes / copy bandwidth; x_floor = time / floor."
      "\ntarget: sparse_decode >= 75% of copy at N >= 32; index_topk >= 70% at 65536+ entries."
      "\ncheck (--verify): against the float64 reference with the tests' bounds, for points"
      "\nwith N*Hq*L*512 (sparse) or N*entries*64*128 (index) <= --verify-budget; '-' beyond",
      options, json_path, *device, baseline, timing, failures);
}

}  // namespace bench
}  // namespace hdk
