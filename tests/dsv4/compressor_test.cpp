// hdk::dsv4::compress over whole sequences against the float64 reference (CompressorReference,
// which keeps the spec's raw rows): HCA with m = 128 over 3 windows, CSA with m = 4 over more
// than 10 windows, d = 512 (MODEL1 entries) and d = 128 (MXFP4 / NVFP4 / FP8 keys, rotated or not),
// T = 1 and T = 2 tokens per row, fp32 and bf16 inputs. Two requests interleave in random order
// with padding rows between them; one starts mid-window and mid-page from a state the reference
// exports; pages fill and the next page comes from the block table. After every step each new
// entry, decoded, must lie within the FP8 (or FP4) bound of the float64 entry, and every other
// byte of the poisoned cache must be unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4/kv_cache/reference/kv_cache_reference.h"
#include "hdk/dsv4/kv_cache.h"
#include "support/device_memory.h"
#include "support/kv_cache_case.h"

namespace hdk {
namespace testing {
namespace {

struct CompressorCase {
  int64_t ratio = 4;
  int64_t dim = 512;
  int64_t tokens_per_row = 1;  // T
  int64_t windows = 12;        // per request (the first request's sequence length / ratio)
  int64_t block_size = 4;
  int64_t mid_start = 26;  // the second request's first position (from an exported state)
  DType input_dtype = DType::kFloat32;
  dsv4::KeyFormat format = dsv4::KeyFormat::kMXFP4;
  bool rotate = true;
  bool nan_token = false;  // one token's score is NaN: its entry is marked and counted
  uint64_t seed = 1;

  std::string describe() const {
    return "ratio=" + std::to_string(ratio) + " d=" + std::to_string(dim) +
           " T=" + std::to_string(tokens_per_row) + " windows=" + std::to_string(windows) +
           " block_size=" + std::to_string(block_size) + " " + dtype_name(input_dtype) +
           (dim == 128 ? std::string(" ") + key_format_name(format) : std::string()) +
           (dim == 128 && rotate ? " rotated" : "") + (nan_token ? " nan-token" : "") +
           " seed=" + std::to_string(seed);
  }
};

struct Request {
  int64_t state_slot;
  int64_t position;  // next position
  int64_t end;       // one past the last position
  std::vector<int32_t> pages;
};

struct CompressorRun {
  double worst_relative = 0;
  int64_t entries = 0;
};

CompressorRun run_sequences(const CompressorCase& c, Backend backend) {
  SCOPED_TRACE(c.describe());
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t m = c.ratio, d = c.dim;
  const bool overlap = m == 4;
  const int64_t width = overlap ? 2 * d : d;
  const int64_t accumulators = dsv4::compressor_accumulators(m);
  const int64_t num_states = 5;
  const int64_t entry_bytes = d == 512 ? dsv4::kEntryBytes : dsv4::key_bytes(c.format);
  const int64_t length = c.windows * m;
  const int64_t entries_per_request = c.windows;
  const int64_t pages_per_request = (entries_per_request + c.block_size - 1) / c.block_size;
  const int64_t num_blocks = 2 * pages_per_request + 3;
  const int64_t max_blocks = pages_per_request + 1;
  const int64_t max_position = length + m;

  // Weights of the layer.
  std::vector<float> ape(static_cast<size_t>(m * width)), norm_weight(d), cos_table, sin_table;
  for (auto& v : ape)
    v = 0.5f * normal(rng);
  for (auto& v : norm_weight)
    v = 1.0f + 0.2f * normal(rng);
  for (int64_t p = 0; p < max_position; ++p) {
    for (int64_t i = 0; i < 32; ++i) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(i) / 32);
      cos_table.push_back(static_cast<float>(std::cos(angle)));
      sin_table.push_back(static_cast<float>(std::sin(angle)));
    }
  }

  // Two requests on distinct pages: A from position 0, B from mid_start (mid-window, mid-page).
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b)
    blocks[b] = static_cast<int32_t>(b);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<Request> requests(2);
  for (int r = 0; r < 2; ++r) {
    requests[r].state_slot = r == 0 ? 3 : 1;
    requests[r].position = 0;
    requests[r].end = length;
    requests[r].pages.assign(blocks.begin() + r * pages_per_request,
                             blocks.begin() + (r + 1) * pages_per_request);
  }

  dsv4::CompressorReference reference(m, d);
  std::vector<uint8_t> cache(static_cast<size_t>(num_blocks * c.block_size * entry_bytes));
  for (auto& byte : cache)
    byte = static_cast<uint8_t>(rng());
  std::vector<float> state(static_cast<size_t>(num_states * accumulators * 3 * d));
  for (auto& v : state)
    v = normal(rng) * 100.0f;  // garbage of an earlier request: must never be read

  const Device device = backend_device(backend);
  const Device cpu = Device::cpu();
  DeviceBuffer d_cache(backend, cache.size()), d_state(backend, state.size() * 4),
      d_ape(backend, ape.size() * 4), d_norm(backend, norm_weight.size() * 4),
      d_cos(backend, cos_table.size() * 4), d_sin(backend, sin_table.size() * 4),
      d_counter(backend, 8);
  d_ape.upload(ape.data(), ape.size() * 4);
  d_norm.upload(norm_weight.data(), norm_weight.size() * 4);
  d_cos.upload(cos_table.data(), cos_table.size() * 4);
  d_sin.upload(sin_table.data(), sin_table.size() * 4);
  std::vector<uint8_t> counter = counter_bytes(DType::kInt64, 0), want_counter = counter;
  d_counter.upload(counter.data(), 8);

  struct Step {
    std::vector<int64_t> rows;  // request index, or -1 for padding
  };
  auto make_params = [&](int64_t N, int64_t T, void* kv, void* score, void* positions,
                         void* state_slots, void* block_table, Device where, void* state_data,
                         void* cache_data, void* ape_data, void* norm_data, void* cos_data,
                         void* sin_data, void* counter_data) {
    dsv4::CompressorParams p;
    p.kv = TensorView::contiguous(kv, c.input_dtype, {N, T, width}, where);
    p.score = TensorView::contiguous(score, c.input_dtype, {N, T, width}, where);
    p.ape = TensorView::contiguous(ape_data, DType::kFloat32, {m, width}, where);
    p.positions = TensorView::contiguous(positions, DType::kInt64, {N}, where);
    p.state_slots = TensorView::contiguous(state_slots, DType::kInt32, {N}, where);
    p.state = TensorView::contiguous(state_data, DType::kFloat32, {num_states, accumulators, 3, d},
                                     where);
    p.norm_weight = TensorView::contiguous(norm_data, DType::kFloat32, {d}, where);
    p.rope_cos = TensorView::contiguous(cos_data, DType::kFloat32, {max_position, 32}, where);
    p.rope_sin = TensorView::contiguous(sin_data, DType::kFloat32, {max_position, 32}, where);
    p.block_table = TensorView::contiguous(block_table, DType::kInt32, {N, max_blocks}, where);
    p.cache = TensorView::contiguous(cache_data, DType::kUInt8,
                                     {num_blocks, c.block_size * entry_bytes}, where);
    p.block_size = c.block_size;
    p.ratio = m;
    p.key_format = c.format;
    p.rotate = c.rotate;
    p.invalid_count = TensorView::contiguous(counter_data, DType::kInt64, {1}, where);
    return p;
  };

  // One call with `rows` (request indices, -1 padding), T tokens each; `backend_too` false runs
  // only the reference (the second request's prefix).
  CompressorRun run;
  bool planted_nan = false;
  auto call = [&](const std::vector<int64_t>& rows, int64_t T, bool backend_too) {
    const int64_t N = static_cast<int64_t>(rows.size());
    std::vector<float> kv(static_cast<size_t>(N * T * width)), score(kv.size());
    for (auto& v : kv)
      v = normal(rng);
    for (auto& v : score)
      v = 2.0f * normal(rng);
    if (c.nan_token && backend_too && !planted_nan && rows[0] >= 0) {
      score[5] = std::numeric_limits<float>::quiet_NaN();
      planted_nan = true;
    }
    std::vector<int64_t> positions(N), slots(N);
    std::vector<int32_t> table(static_cast<size_t>(N * max_blocks), -7);
    for (int64_t n = 0; n < N; ++n) {
      if (rows[n] < 0) {
        positions[n] = static_cast<int64_t>(rng() % 1000);
        slots[n] = -1;
        continue;
      }
      const Request& r = requests[rows[n]];
      positions[n] = r.position;
      slots[n] = r.state_slot;
      for (size_t j = 0; j < r.pages.size(); ++j)
        table[n * max_blocks + j] = r.pages[j];
    }
    std::vector<uint8_t> kv_bytes = encode_rows(kv, c.input_dtype),
                         score_bytes = encode_rows(score, c.input_dtype),
                         position_bytes = index_bytes(positions, DType::kInt64),
                         slot_bytes = index_bytes(slots, DType::kInt32);
    const dsv4::CompressorParams host =
        make_params(N, T, kv_bytes.data(), score_bytes.data(), position_bytes.data(),
                    slot_bytes.data(), table.data(), cpu, state.data(), cache.data(), ape.data(),
                    norm_weight.data(), cos_table.data(), sin_table.data(), want_counter.data());
    const std::vector<dsv4::CompressorReference::Entry> entries = reference.run(host);
    for (int64_t n = 0; n < N; ++n) {
      if (rows[n] >= 0) requests[rows[n]].position += T;
    }
    if (!backend_too) return;

    DeviceBuffer b_kv(backend, kv_bytes.size()), b_score(backend, score_bytes.size()),
        b_positions(backend, position_bytes.size()), b_slots(backend, slot_bytes.size()),
        b_table(backend, table.size() * 4);
    b_kv.upload(kv_bytes.data(), kv_bytes.size());
    b_score.upload(score_bytes.data(), score_bytes.size());
    b_positions.upload(position_bytes.data(), position_bytes.size());
    b_slots.upload(slot_bytes.data(), slot_bytes.size());
    b_table.upload(table.data(), table.size() * 4);
    dsv4::compress(make_params(N, T, b_kv.data(), b_score.data(), b_positions.data(),
                               b_slots.data(), b_table.data(), device, d_state.data(),
                               d_cache.data(), d_ape.data(), d_norm.data(), d_cos.data(),
                               d_sin.data(), d_counter.data()));
    synchronize(backend);
    std::vector<uint8_t> got(cache.size());
    d_cache.download(got.data(), got.size());

    std::vector<uint8_t> written(cache.size(), 0);
    const int64_t page_bytes = c.block_size * entry_bytes;
    for (const auto& entry : entries) {
      const int64_t page = entry.slot / c.block_size, offset = entry.slot % c.block_size;
      const uint8_t* page_data = got.data() + page * page_bytes;
      if (d == 512) {
        const std::vector<double> stored =
            dsv4::decode_entry_reference(page_data, c.block_size, offset);
        const uint8_t* scales = page_data + c.block_size * 576 + offset * 8;
        const StoredError error = check_stored_entry(stored, entry.stored, scales, 1e-4);
        EXPECT_TRUE(error.failure.empty())
            << "entry " << entry.index << " of state " << entry.state_slot << ": " << error.failure;
        run.worst_relative = std::max(run.worst_relative, error.max_relative);
        std::memset(&written[page * page_bytes + offset * 576], 1, 576);
        std::memset(&written[page * page_bytes + c.block_size * 576 + offset * 8], 1, 8);
      } else {
        const std::vector<double> stored =
            dsv4::decode_key_reference(page_data, c.block_size, offset, c.format);
        const StoredError error = check_stored_key(stored, entry.stored, 1e-4, c.format);
        EXPECT_TRUE(error.failure.empty())
            << "key " << entry.index << " of state " << entry.state_slot << ": " << error.failure;
        run.worst_relative = std::max(run.worst_relative, error.max_relative);
        const int64_t data_bytes = c.format == dsv4::KeyFormat::kFP8 ? 128 : 64;
        const int64_t scale_bytes = entry_bytes - data_bytes;
        std::memset(&written[page * page_bytes + offset * data_bytes], 1,
                    static_cast<size_t>(data_bytes));
        std::memset(&written[page * page_bytes + c.block_size * data_bytes + offset * scale_bytes],
                    1, static_cast<size_t>(scale_bytes));
      }
      ++run.entries;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (!written[i] && got[i] != cache[i]) {
        ADD_FAILURE() << "cache byte " << i << " changed but no entry was due there";
        break;
      }
    }
    cache = got;  // both sides continue from the backend's bytes
  };

  // The second request's prefix runs on the reference alone, then its state is exported.
  Request& late = requests[1];
  while (late.position < c.mid_start) {
    const int64_t T = std::min<int64_t>(c.tokens_per_row, c.mid_start - late.position);
    call({1}, T, false);
  }
  const std::vector<float> exported = reference.export_state(late.state_slot, late.position);
  std::copy(exported.begin(), exported.end(),
            state.begin() + late.state_slot * accumulators * 3 * d);
  d_state.upload(state.data(), state.size() * 4);
  d_cache.upload(cache.data(), cache.size());

  // Interleaved steps with a padding row, until both requests reach their end.
  while (requests[0].position < requests[0].end || requests[1].position < requests[1].end) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < 2; ++r) {
      const Request& request = requests[r];
      if (request.position + c.tokens_per_row <= request.end && rng() % 4 != 0) rows.push_back(r);
    }
    if (rows.empty()) {
      for (int64_t r = 0; r < 2; ++r) {
        if (requests[r].position + c.tokens_per_row <= requests[r].end) rows.push_back(r);
      }
      if (rows.empty()) break;
    }
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.insert(rows.begin() + static_cast<int64_t>(rng() % (rows.size() + 1)), -1);
    call(rows, c.tokens_per_row, true);
  }
  d_counter.download(counter.data(), 8);
  EXPECT_EQ(read_counter(counter, DType::kInt64), read_counter(want_counter, DType::kInt64));
  if (c.nan_token) {
    EXPECT_GT(read_counter(want_counter, DType::kInt64), 0);
  }
  EXPECT_GE(run.entries, c.windows);
  return run;
}

std::vector<CompressorCase> compressor_cases() {
  std::vector<CompressorCase> cases;
  uint64_t seed = 7000;
  // HCA, m = 128: 3 windows, T = 1 and T = 2; the second request starts at 130 (entry 1 of a
  // page of 2: mid-page, mid-window).
  for (int64_t T : {1, 2}) {
    CompressorCase c;
    c.ratio = 128, c.dim = 512, c.tokens_per_row = T, c.windows = 3, c.block_size = 2;
    c.mid_start = 130, c.seed = ++seed;
    c.input_dtype = T == 2 ? DType::kBFloat16 : DType::kFloat32;
    cases.push_back(c);
  }
  // CSA, m = 4: 12 windows over 3 pages of 4 entries; the second request starts at 26.
  for (int64_t dim : {512, 128}) {
    for (int64_t T : {1, 2, 4}) {
      CompressorCase c;
      c.ratio = 4, c.dim = dim, c.tokens_per_row = T, c.windows = 12, c.block_size = 4;
      c.mid_start = T == 4 ? 24 : 26, c.seed = ++seed;
      c.input_dtype = T == 2 ? DType::kBFloat16 : DType::kFloat32;
      cases.push_back(c);
    }
  }
  for (dsv4::KeyFormat format : {dsv4::KeyFormat::kMXFP4, dsv4::KeyFormat::kNVFP4}) {
    for (bool rotate : {false, true}) {
      CompressorCase c;
      c.ratio = 4, c.dim = 128, c.windows = 11, c.block_size = 3, c.mid_start = 9;
      c.format = format, c.rotate = rotate, c.seed = ++seed;
      cases.push_back(c);
    }
  }
  {
    CompressorCase c;  // HCA-style with a small window, and a NaN score
    c.ratio = 8, c.dim = 512, c.windows = 5, c.block_size = 2, c.mid_start = 11;
    c.nan_token = true, c.seed = ++seed;
    cases.push_back(c);
    c.ratio = 4, c.windows = 11, c.block_size = 4, c.seed = ++seed;
    cases.push_back(c);
  }
  // FP8 indexer keys (128 E4M3 and one fp32 scale per key), rotated or not; then T = 2 bf16
  // tokens on pages of 5 with a NaN score (its key is stored as NaN markers and counted).
  for (bool rotate : {false, true}) {
    CompressorCase c;
    c.ratio = 4, c.dim = 128, c.windows = 11, c.block_size = 3, c.mid_start = 9;
    c.format = dsv4::KeyFormat::kFP8, c.rotate = rotate, c.seed = ++seed;
    cases.push_back(c);
  }
  {
    CompressorCase c;
    c.ratio = 4, c.dim = 128, c.tokens_per_row = 2, c.windows = 12, c.block_size = 5;
    c.mid_start = 26, c.input_dtype = DType::kBFloat16, c.format = dsv4::KeyFormat::kFP8;
    c.nan_token = true, c.seed = ++seed;
    cases.push_back(c);
  }
  return cases;
}

class Compressor : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(Compressor, SequencesMatchReference) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << backend_name(backend) << " backend skipped: " << reason;
  static const std::vector<CompressorCase> cases = compressor_cases();
  const CompressorCase& c = cases[std::get<1>(GetParam())];
  const CompressorRun run = run_sequences(c, backend);
  std::printf("[ %s ] %s: %lld entries, largest error after dequantization %.5f (relative)\n",
              backend_name(backend), c.describe().c_str(), static_cast<long long>(run.entries),
              run.worst_relative);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return std::string(backend_name(std::get<0>(info.param))) + "_case" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Sequences, Compressor,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(compressor_cases().size()))),
    param_name);

}  // namespace
}  // namespace testing
}  // namespace hdk
