#include "support/index_topk_case.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"

#ifdef HDK_WITH_CUDA
#include "dsv4/index_topk/cuda/index_topk_cuda.h"
#endif

namespace hdk {
namespace testing {

namespace {

using dsv4::KeyFormat;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A random E4M3 code other than the NaN ones (0x7F, 0xFF).
uint8_t random_e4m3(std::mt19937_64& rng) {
  uint8_t code;
  do {
    code = static_cast<uint8_t>(rng());
  } while ((code & 0x7f) == 0x7f);
  return code;
}

// A UE8M0 byte of 2^-range .. 2^range.
uint8_t random_ue8m0(std::mt19937_64& rng, int range) {
  return static_cast<uint8_t>(127 - range + static_cast<int>(rng() % (2 * range + 1)));
}

// Entry e's key as bytes for the quantized-q forms (make_index_inputs): kFP8, 128 E4M3 codes and
// an fp32 scale of 2^-6 .. 2^6 (every third key's with a random mantissa, as an engine that
// stores amax / 448 has), 2^(e % 61 - 30) when spread, some negative or zero when signed; kMXFP4,
// 64 random bytes of E2M1 pairs and 4 UE8M0 scales of 2^-4 .. 2^4, 2^-40 .. 2^40 when spread.
std::vector<uint8_t> random_key_image(std::mt19937_64& rng, const IndexCase& c, int64_t e) {
  std::vector<uint8_t> image(static_cast<size_t>(dsv4::key_bytes(c.format)));
  if (c.format == KeyFormat::kFP8) {
    for (int64_t i = 0; i < dsv4::kIndexerKeyDim; ++i)
      image[i] = random_e4m3(rng);
    const int exponent =
        c.spread_key_scales ? static_cast<int>(e % 61) - 30 : static_cast<int>(rng() % 13) - 6;
    float scale = std::ldexp(1.0f, exponent);
    if (!c.spread_key_scales && e % 3 == 0) {
      scale *= 1.0f + std::ldexp(static_cast<float>(rng() % (1u << 23)), -23);
    }
    if (c.signed_key_scales && (e / 64) % 2 == 1) {
      if (e % 5 == 1) scale = -scale;
      if (e % 7 == 3) scale = 0.0f;
    }
    std::memcpy(&image[dsv4::kIndexerKeyDim], &scale, sizeof(scale));
  } else {
    for (int64_t i = 0; i < 64; ++i)
      image[i] = static_cast<uint8_t>(rng());
    for (int64_t g = 0; g < 4; ++g)
      image[64 + g] = random_ue8m0(rng, c.spread_key_scales ? 40 : 4);
  }
  return image;
}

}  // namespace

const char* index_query_name(IndexQuery form) {
  switch (form) {
    case IndexQuery::kExact:
      return "exact";
    case IndexQuery::kE4M3:
      return "e4m3";
    case IndexQuery::kMXFP4:
      return "packed-mxfp4";
  }
  return "?";
}

void place_key_bytes(const IndexCase& c, IndexInputs& in, int64_t slot, const uint8_t* image) {
  const int64_t bs = c.block_size;
  const int64_t data = c.format == KeyFormat::kFP8 ? dsv4::kIndexerKeyDim : 64;
  const int64_t scale = dsv4::key_bytes(c.format) - data;
  uint8_t* page = in.cache.data() + (slot / bs) * bs * dsv4::key_bytes(c.format);
  std::memcpy(page + (slot % bs) * data, image, static_cast<size_t>(data));
  std::memcpy(page + bs * data + (slot % bs) * scale, image + data, static_cast<size_t>(scale));
}

IndexInputs make_index_inputs(const IndexCase& c) {
  std::mt19937_64 rng(c.seed);
  IndexInputs in;
  in.N = static_cast<int64_t>(c.counts.size());
  const int64_t bs = c.block_size;
  int64_t pages = 0;
  for (int64_t count : c.counts) {
    in.max_blocks = std::max(in.max_blocks, (count + bs - 1) / bs + 1);
    pages += (count + bs - 1) / bs;
  }
  in.num_blocks = pages + 2;
  std::vector<int32_t> blocks(static_cast<size_t>(in.num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  in.block_table.assign(static_cast<size_t>(in.N * in.max_blocks), -1);
  std::vector<int64_t> slots;
  int64_t next = 0;
  for (int64_t n = 0; n < in.N; ++n) {
    for (int64_t page = 0; page * bs < c.counts[n]; ++page)
      in.block_table[n * in.max_blocks + page] = blocks[next++];
    for (int64_t s = 0; s < c.counts[n]; ++s)
      slots.push_back(in.block_table[n * in.max_blocks + s / bs] * bs + s % bs);
  }
  const int64_t entries = static_cast<int64_t>(slots.size());
  in.counts = index_bytes(c.counts, c.count_dtype);
  in.indices.assign(static_cast<size_t>(in.N * c.top_k), 0x5a5a5a5a);
  in.scores.assign(static_cast<size_t>(in.N * c.top_k), kNaN);
  in.slots.assign(static_cast<size_t>(in.N * c.top_k), 0x5a5a5a5a);
  in.cache.resize(static_cast<size_t>(in.num_blocks * bs * dsv4::key_bytes(c.format)));
  if (c.q_form != IndexQuery::kExact && !c.stored_keys) {
    for (auto& byte : in.cache)
      byte = static_cast<uint8_t>(rng());
    std::vector<std::vector<uint8_t>> images;
    for (int64_t e = 0; e < entries; ++e) {
      images.push_back(c.distinct_keys > 0 && e >= c.distinct_keys
                           ? images[static_cast<size_t>((e * 7) % c.distinct_keys)]
                           : random_key_image(rng, c, e));
      place_key_bytes(c, in, slots[e], images.back().data());
    }
  } else {
    std::vector<float> keys = normal_values(rng, entries * dsv4::kIndexerKeyDim, 1.0f);
    if (c.distinct_keys > 0) {
      for (int64_t e = 0; e < entries; ++e) {
        const int64_t source = (e * 7) % c.distinct_keys;
        for (int64_t i = 0; i < dsv4::kIndexerKeyDim; ++i)
          keys[e * dsv4::kIndexerKeyDim + i] = keys[source * dsv4::kIndexerKeyDim + i];
      }
    }
    if (c.spread_key_scales) {
      for (int64_t e = 0; e < entries; ++e) {
        for (int64_t i = 0; i < dsv4::kIndexerKeyDim; ++i)
          keys[e * dsv4::kIndexerKeyDim + i] *= std::ldexp(1.0f, static_cast<int>(e % 17) - 8);
      }
    }
    for (auto& byte : in.cache)
      byte = static_cast<uint8_t>(rng());
    if (entries > 0) {
      std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt64);
      dsv4::StoreIndexerKeysParams store;
      store.keys =
          TensorView::contiguous(keys.data(), DType::kFloat32, {entries, dsv4::kIndexerKeyDim});
      store.slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {entries});
      store.cache = TensorView::contiguous(in.cache.data(), DType::kUInt8,
                                           {in.num_blocks, bs * dsv4::key_bytes(c.format)});
      store.block_size = bs;
      store.format = c.format;
      dsv4::store_indexer_keys(store);
    }
  }
  const int64_t vectors = in.N * c.heads;
  if (c.q_form == IndexQuery::kExact) {
    in.q = normal_values(rng, vectors * dsv4::kIndexerKeyDim, 1.0f);
    in.weights = normal_values(rng, vectors, 0.1f);
    in.q_bytes = encode_rows(in.q, c.q_dtype);
    in.q_bytes.insert(in.q_bytes.begin(), static_cast<size_t>(c.q_pad_bytes()), uint8_t{0x7f});
    return in;
  }
  in.q_bytes.resize(static_cast<size_t>(vectors * c.q_width()));
  for (auto& byte : in.q_bytes)
    byte = c.q_form == IndexQuery::kE4M3 ? random_e4m3(rng) : static_cast<uint8_t>(rng());
  if (c.q_form == IndexQuery::kMXFP4) {
    in.q_scales.resize(static_cast<size_t>(vectors * 4));
    for (auto& byte : in.q_scales)
      byte = random_ue8m0(rng, c.spread_key_scales ? 40 : 4);
    in.q_scales.insert(in.q_scales.begin(), static_cast<size_t>(c.q_pad_bytes()), 0xff);
  }
  in.q_bytes.insert(in.q_bytes.begin(), static_cast<size_t>(c.q_pad_bytes()), 0xff);
  in.weights = normal_values(rng, vectors, 0.1f);
  return in;
}

void check_index_outputs(const IndexCase& c, const IndexInputs& in,
                         const dsv4::IndexerReference& ref, double relative_tolerance) {
  const int64_t K = c.top_k;
  for (int64_t n = 0; n < in.N; ++n) {
    SCOPED_TRACE("row " + std::to_string(n));
    const int32_t* got = &in.indices[n * K];
    const float* got_scores = &in.scores[n * K];
    const int64_t count = ref.invalid[n] ? 0 : c.counts[n];
    const int64_t kept = std::min(K, count);
    for (int64_t j = 0; j < K && c.slots; ++j) {
      const int32_t s = got[j];
      const int64_t want =
          s < 0 ? -1
                : in.block_table[n * in.max_blocks + s / c.block_size] * c.block_size +
                      s % c.block_size;
      ASSERT_EQ(in.slots[n * K + j], want) << "slot of position " << j << " (entry " << s << ")";
    }
    for (int64_t j = kept; j < K; ++j) {
      ASSERT_EQ(got[j], -1) << "padding at " << j;
      if (c.scores) {
        ASSERT_EQ(got_scores[j], -kInf) << "padding at " << j;
      }
    }
    if (kept == 0) continue;
    const std::vector<double>& score = ref.scores[n];
    std::vector<double> tol(static_cast<size_t>(count));
    for (int64_t s = 0; s < count; ++s)
      tol[s] = relative_tolerance * ref.magnitudes[n][s] + 1e-30;
    if (c.distinct_keys > 0) {
      for (int64_t j = 0; j < kept; ++j)
        ASSERT_EQ(got[j], ref.indices[n * K + j]) << "exact ties: position " << j;
    }
    // A key stored with NaN markers scores NaN and ranks below every number: it is chosen only
    // after all of them, and its score comes back NaN.
    std::vector<uint8_t> chosen(static_cast<size_t>(count), 0);
    double lowest_chosen = std::numeric_limits<double>::infinity();
    bool chose_nan = false;
    for (int64_t j = 0; j < kept; ++j) {
      const int32_t s = got[j];
      ASSERT_TRUE(s >= 0 && s < count) << "index " << s << " at " << j;
      ASSERT_FALSE(chosen[s]) << "index " << s << " twice";
      chosen[s] = 1;
      const bool nan = std::isnan(score[s]);
      chose_nan = chose_nan || nan;
      if (!nan) lowest_chosen = std::min(lowest_chosen, score[s] + tol[s]);
      if (j > 0) {  // best first: a later entry may beat an earlier one only within tolerance
        const int32_t before = got[j - 1];
        if (std::isnan(score[before])) {
          ASSERT_TRUE(nan) << "a number after a NaN score at " << j;
        } else if (!nan) {
          ASSERT_LE(score[s], score[before] + tol[s] + tol[before]) << "order at " << j;
        }
      }
      if (c.scores) {
        if (nan) {
          ASSERT_TRUE(std::isnan(got_scores[j])) << "score of NaN-marked entry " << s;
          continue;
        }
        ASSERT_NEAR(got_scores[j], score[s], tol[s]) << "score of entry " << s;
        if (j > 0) {
          ASSERT_GE(got_scores[j - 1], got_scores[j]) << "not best first at " << j;
          if (got_scores[j - 1] == got_scores[j]) {
            ASSERT_LT(got[j - 1], got[j]) << "tie order";
          }
        }
      }
    }
    for (int64_t s = 0; s < count; ++s) {
      if (chosen[s] || std::isnan(score[s])) continue;
      ASSERT_FALSE(chose_nan) << "entry " << s
                              << " scores a number but a NaN-marked one was chosen";
      ASSERT_LE(score[s] - tol[s], lowest_chosen) << "entry " << s << " should have been chosen";
    }
  }
}

const char* index_backend_name(IndexBackend backend) {
  switch (backend) {
    case IndexBackend::kCPU:
      return "cpu";
    case IndexBackend::kCudaTensorCore:
      return "cuda_tensor_core";
    case IndexBackend::kCudaWarpMma:
      return "cuda_warp_mma";
    case IndexBackend::kCudaCore:
      return "cuda_core";
  }
  return "?";
}

void PrintTo(IndexBackend backend, std::ostream* os) {
  *os << index_backend_name(backend);
}

void PrintTo(IndexQuery form, std::ostream* os) {
  *os << index_query_name(form);
}

Backend memory_of(IndexBackend backend) {
  return backend == IndexBackend::kCPU ? Backend::kCPU : Backend::kCUDA;
}

double index_tolerance(IndexBackend backend, DType q_dtype) {
  const bool split_queries =
      backend == IndexBackend::kCudaTensorCore || backend == IndexBackend::kCudaWarpMma;
  return split_queries && q_dtype == DType::kFloat32 ? 2.6e-5 : 1e-5;
}

double index_tolerance(IndexBackend backend, const IndexCase& c) {
  switch (c.q_form) {
    case IndexQuery::kExact:
      return index_tolerance(backend, c.q_dtype);
    case IndexQuery::kE4M3:
      // On FP8 tensor cores (as DeepGEMM's logits) the products are exact but Hopper's FP8 MMA
      // accumulates them with about 14 bits kept: over 4 k-steps of 32 the H200 showed up to
      // 4.8e-4 x the sum of the terms' magnitudes (2^-11); the bound is 2^-8. CUDA cores and
      // the CPU add in fp32.
      return backend == IndexBackend::kCudaTensorCore || backend == IndexBackend::kCudaWarpMma
                 ? std::ldexp(1.0, -8)
                 : 1e-5;
    case IndexQuery::kMXFP4:
      // Exact group terms, then 4 H + H - 1 fp32 additions and H products in any order: at most
      // (H + 3) 2^-24 x the sum of the terms' magnitudes, to first order; 5 units of slack.
      return static_cast<double>(c.heads + 8) * std::ldexp(1.0, -24);
  }
  return 1e-5;
}

ScorePathScope::ScorePathScope(IndexBackend backend) {
#ifdef HDK_WITH_CUDA
  dsv4::detail::set_index_score_path(
      backend == IndexBackend::kCudaCore      ? dsv4::detail::IndexScorePath::kCudaCore
      : backend == IndexBackend::kCudaWarpMma ? dsv4::detail::IndexScorePath::kWarpMma
                                              : dsv4::detail::IndexScorePath::kTensorCore);
#else
  (void)backend;
#endif
}

ScorePathScope::~ScorePathScope() {
#ifdef HDK_WITH_CUDA
  dsv4::detail::set_index_score_path(dsv4::detail::IndexScorePath::kTensorCore);
#endif
}

namespace {

DeviceBuffer copy_to(Backend memory, const void* host, size_t bytes) {
  DeviceBuffer b(memory, std::max<size_t>(bytes, 16));
  if (bytes > 0) b.upload(host, bytes);
  return b;
}

}  // namespace

IndexDeviceCall::IndexDeviceCall(const IndexCase& c, const IndexInputs& in, Backend memory)
    : memory_(memory),
      q_(copy_to(memory, in.q_bytes.data(), in.q_bytes.size())),
      q_scales_(copy_to(memory, in.q_scales.data(), in.q_scales.size())),
      weights_(copy_to(memory, in.weights.data(), in.weights.size() * 4)),
      cache_(copy_to(memory, in.cache.data(), in.cache.size())),
      table_(copy_to(memory, in.block_table.data(), in.block_table.size() * 4)),
      counts_(copy_to(memory, in.counts.data(), in.counts.size())),
      indices_(copy_to(memory, in.indices.data(), in.indices.size() * 4)),
      scores_(copy_to(memory, in.scores.data(), in.scores.size() * 4)),
      slots_(copy_to(memory, in.slots.data(), in.slots.size() * 4)),
      counter_(copy_to(memory, in.counter.data(), in.counter.size())) {
  IndexInputs& views = const_cast<IndexInputs&>(in);  // params() only reads the host arrays
  params = views.params(c);
  const Device device = backend_device(memory);
  auto to_device = [&](TensorView& view, const DeviceBuffer& b) {
    view.data = b.data();
    view.device = device;
  };
  to_device(params.q, q_);
  params.q.data = static_cast<uint8_t*>(q_.data()) + c.q_pad_bytes();
  if (params.q_scales.defined()) {
    to_device(params.q_scales, q_scales_);
    params.q_scales.data = static_cast<uint8_t*>(q_scales_.data()) + c.q_pad_bytes();
  }
  to_device(params.weights, weights_);
  to_device(params.key_cache, cache_);
  to_device(params.block_table, table_);
  to_device(params.num_entries, counts_);
  to_device(params.topk_indices, indices_);
  if (params.topk_scores.defined()) to_device(params.topk_scores, scores_);
  if (params.topk_slots.defined()) to_device(params.topk_slots, slots_);
  to_device(params.invalid_count, counter_);
}

void IndexDeviceCall::reset_outputs(const IndexInputs& in) {
  indices_.upload(in.indices.data(), in.indices.size() * 4);
  scores_.upload(in.scores.data(), in.scores.size() * 4);
  slots_.upload(in.slots.data(), in.slots.size() * 4);
  counter_.upload(in.counter.data(), in.counter.size());
}

void IndexDeviceCall::download(IndexInputs& in) const {
  synchronize(memory_);
  indices_.download(in.indices.data(), in.indices.size() * 4);
  scores_.download(in.scores.data(), in.scores.size() * 4);
  slots_.download(in.slots.data(), in.slots.size() * 4);
  counter_.download(in.counter.data(), in.counter.size());
}

void run_index_topk(const IndexCase& c, IndexInputs& in, IndexBackend backend) {
  if (backend == IndexBackend::kCPU) {
    dsv4::index_topk(in.params(c));
    return;
  }
  ScorePathScope scope(backend);
  IndexDeviceCall call(c, in, memory_of(backend));
  dsv4::index_topk(call.params);
  call.download(in);
}

void run_index_case(const IndexCase& c, IndexBackend backend) {
  SCOPED_TRACE(c.describe() + " on " + index_backend_name(backend));
  IndexInputs in = make_index_inputs(c);
  std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt32, 3);
  dsv4::IndexerParams ref_params = in.params(c);
  ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt32, {1});
  const dsv4::IndexerReference ref = dsv4::index_topk_reference(ref_params);
  run_index_topk(c, in, backend);
  EXPECT_EQ(read_counter(in.counter, DType::kInt32), 3 + ref.invalid_rows);
  EXPECT_EQ(read_counter(ref_counter, DType::kInt32), 3 + ref.invalid_rows);
  check_index_outputs(c, in, ref, index_tolerance(backend, c));
}

}  // namespace testing
}  // namespace hdk
