#include "support/gdn_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "core/float_convert.h"
#include "gdn/reference/decode_reference.h"

namespace hdk {
namespace testing {
namespace {

using hdk::detail::bf16_to_float;
using hdk::detail::float_to_bf16;
using hdk::detail::float_to_half;
using hdk::detail::half_to_float;

void put_float(std::vector<uint8_t>& bytes, DType dtype, int64_t index, double value) {
  const auto f = static_cast<float>(value);
  if (dtype == DType::kFloat32) {
    std::memcpy(bytes.data() + index * 4, &f, 4);
  } else {
    const uint16_t h = dtype == DType::kBFloat16 ? float_to_bf16(f) : float_to_half(f);
    std::memcpy(bytes.data() + index * 2, &h, 2);
  }
}

double get_float(const std::vector<uint8_t>& bytes, DType dtype, int64_t index) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, bytes.data() + index * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + index * 2, 2);
  return dtype == DType::kBFloat16 ? bf16_to_float(h) : half_to_float(h);
}

void put_index(std::vector<uint8_t>& bytes, DType dtype, int64_t index, int64_t value) {
  if (dtype == DType::kInt64) {
    std::memcpy(bytes.data() + index * 8, &value, 8);
  } else {
    const auto narrow = static_cast<int32_t>(value);
    std::memcpy(bytes.data() + index * 4, &narrow, 4);
  }
}

std::vector<int64_t> row_major(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t running = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = running;
    running *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

int64_t product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

const char* short_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kInt32:
      return "i32";
    case DType::kInt64:
      return "i64";
    default:
      return "?";
  }
}

}  // namespace

std::vector<uint8_t> random_floats(DType dtype, int64_t count, uint64_t seed, double mean,
                                   double stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(mean, stddev);
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * dtype_size(dtype));
  for (int64_t i = 0; i < count; ++i)
    put_float(bytes, dtype, i, normal(rng));
  return bytes;
}

std::string GdnCaseConfig::describe() const {
  std::ostringstream text;
  text << "B=" << B << " T=" << T << " H=" << H << " HV=" << HV << " K=" << K << " V=" << V
       << " in=" << short_name(input_dtype) << " gate=" << short_name(gate_dtype)
       << " state=" << short_name(state_dtype) << " out=" << short_name(out_dtype)
       << " layout=" << (layout == gdn::StateLayout::kVK ? "VK" : "KV")
       << (fused_gating ? " fused" : " g/beta") << (use_qk_l2norm ? "" : " no-l2norm") << " idx="
       << (indices == IndexKind::kNone         ? "none"
           : indices == IndexKind::kPerRequest ? "1d"
                                               : "2d")
       << short_name(index_dtype) << (num_accepted_tokens ? " accepted" : "")
       << (split_pool ? " split" : "") << (padding_fraction > 0 ? " padding" : "")
       << (invalid_rows > 0 ? " invalid" : "") << (slot_padding_rows > 0 ? " pitch" : "")
       << (packed_inputs ? " packed" : "") << (intermediate ? " cache" : "")
       << (update_state ? "" : " no-update") << (varlen_lengths.empty() ? "" : " varlen")
       << (max_tokens_per_request > 0 ? " max-tokens" : "") << " seed=" << seed;
  return text.str();
}

int GdnCase::add_buffer(BufferSpec spec) {
  buffers_.push_back(std::move(spec));
  return static_cast<int>(buffers_.size()) - 1;
}

GdnCase::GdnCase(const GdnCaseConfig& config) : config_(config) {
  const GdnCaseConfig& c = config_;
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 17);
  auto next_seed = [&] { return rng(); };
  const bool varlen = !c.varlen_lengths.empty();
  const int64_t B = varlen ? static_cast<int64_t>(c.varlen_lengths.size()) : c.B;
  int64_t longest = 1;
  int64_t total = B * c.T;
  if (varlen) {
    total = std::accumulate(c.varlen_lengths.begin(), c.varlen_lengths.end(), int64_t{0});
    longest =
        std::max<int64_t>(1, *std::max_element(c.varlen_lengths.begin(), c.varlen_lengths.end()));
  }
  const int64_t dim0 = varlen ? 1 : B;
  const int64_t dim1 = varlen ? total : c.T;
  const int64_t capacity =
      c.capacity > 0 ? c.capacity : (varlen ? longest : std::max<int64_t>(c.T, 1));
  const int64_t H = c.H, HV = c.HV, K = c.K, V = c.V;
  const bool vk = c.layout == gdn::StateLayout::kVK;

  auto make_view = [](int buffer, DType dtype, std::vector<int64_t> shape,
                      std::vector<int64_t> strides = {}, int64_t offset = 0) {
    ViewSpec view;
    view.buffer = buffer;
    view.dtype = dtype;
    view.offset = offset;
    if (strides.empty()) strides = row_major(shape);
    view.shape = std::move(shape);
    view.strides = std::move(strides);
    return view;
  };
  auto input_buffer = [&](const char* name, DType dtype, int64_t count, double mean,
                          double stddev) {
    return add_buffer(
        {name, random_floats(dtype, count, next_seed(), mean, stddev), dtype, false, 1});
  };

  // q, k, v (unit-normal; l2norm or scale keeps the step stable).
  if (c.packed_inputs) {
    // A mixed_qkv-like buffer [dim0, dim1, width] with padding, sliced without copies.
    const int64_t width = 2 * H * K + HV * V + 8;
    const int id = input_buffer("mixed_qkv", c.input_dtype, dim0 * dim1 * width, 0.0, 1.0);
    q = make_view(id, c.input_dtype, {dim0, dim1, H, K}, {dim1 * width, width, K, 1}, 0);
    k = make_view(id, c.input_dtype, {dim0, dim1, H, K}, {dim1 * width, width, K, 1}, H * K);
    v = make_view(id, c.input_dtype, {dim0, dim1, HV, V}, {dim1 * width, width, V, 1}, 2 * H * K);
  } else {
    q = make_view(input_buffer("q", c.input_dtype, dim0 * dim1 * H * K, 0.0, 1.0), c.input_dtype,
                  {dim0, dim1, H, K});
    k = make_view(input_buffer("k", c.input_dtype, dim0 * dim1 * H * K, 0.0, 1.0), c.input_dtype,
                  {dim0, dim1, H, K});
    v = make_view(input_buffer("v", c.input_dtype, dim0 * dim1 * HV * V, 0.0, 1.0), c.input_dtype,
                  {dim0, dim1, HV, V});
  }
  if (!c.use_qk_l2norm && c.scale == 0.0f) {
    // Without normalization keep |k| near 1 so the recurrence stays bounded.
    std::vector<uint8_t>& key_bytes = buffers_[k.buffer].initial;
    for (int64_t i = 0; i < static_cast<int64_t>(key_bytes.size() / dtype_size(c.input_dtype));
         ++i) {
      put_float(key_bytes, c.input_dtype, i,
                get_float(key_bytes, c.input_dtype, i) / std::sqrt(static_cast<double>(K)));
    }
  }

  // Gating.
  if (c.fused_gating) {
    A_log = make_view(add_buffer({"A_log", {}, DType::kFloat32, false, 1}), DType::kFloat32, {HV});
    std::uniform_real_distribution<double> log_rate(-3.0, 0.5);
    buffers_[A_log.buffer].initial.resize(HV * 4);
    for (int64_t h = 0; h < HV; ++h) {
      put_float(buffers_[A_log.buffer].initial, DType::kFloat32, h, log_rate(rng));
    }
    dt_bias =
        make_view(input_buffer("dt_bias", c.dt_bias_dtype, HV, 0.0, 1.0), c.dt_bias_dtype, {HV});
    if (c.packed_inputs) {
      const int64_t width = 2 * HV + 3;
      const int id = input_buffer("ab", c.gate_dtype, dim0 * dim1 * width, 0.0, 1.5);
      a = make_view(id, c.gate_dtype, {dim0, dim1, HV}, {dim1 * width, width, 1}, 0);
      b = make_view(id, c.gate_dtype, {dim0, dim1, HV}, {dim1 * width, width, 1}, HV + 1);
    } else {
      a = make_view(input_buffer("a", c.gate_dtype, dim0 * dim1 * HV, 0.0, 1.5), c.gate_dtype,
                    {dim0, dim1, HV});
      b = make_view(input_buffer("b", c.gate_dtype, dim0 * dim1 * HV, 0.0, 1.5), c.gate_dtype,
                    {dim0, dim1, HV});
    }
  } else {
    std::uniform_real_distribution<double> log_decay(-2.0, -0.01);
    std::uniform_real_distribution<double> strength(0.05, 0.95);
    const int64_t count = dim0 * dim1 * HV;
    std::vector<uint8_t> g_bytes(count * 4), beta_bytes(count * 4);
    for (int64_t i = 0; i < count; ++i) {
      put_float(g_bytes, DType::kFloat32, i, log_decay(rng));
      put_float(beta_bytes, DType::kFloat32, i, strength(rng));
    }
    g = make_view(add_buffer({"g", g_bytes, DType::kFloat32, false, 1}), DType::kFloat32,
                  {dim0, dim1, HV});
    beta = make_view(add_buffer({"beta", beta_bytes, DType::kFloat32, false, 1}), DType::kFloat32,
                     {dim0, dim1, HV});
  }

  // Slot assignment.
  int64_t slots_needed = B;
  if (c.indices == IndexKind::kPerToken) slots_needed = B * capacity;
  if (c.split_pool) slots_needed += B;
  pool_size_ = slots_needed + c.extra_slots;
  std::vector<int64_t> order(pool_size_);
  std::iota(order.begin(), order.end(), 0);
  if (c.shuffle_slots) std::shuffle(order.begin(), order.end(), rng);
  if (c.indices == IndexKind::kNone) {
    // Request n must use slot n: keep 0..B-1 in place, shuffle only the split-pool targets.
    std::iota(order.begin(), order.end(), 0);
    if (c.shuffle_slots) std::shuffle(order.begin() + B, order.end(), rng);
  }

  std::vector<int64_t> rows(B);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  const auto padding_rows = static_cast<int64_t>(std::llround(c.padding_fraction * B));
  std::vector<char> is_padding(B, 0), is_invalid(B, 0), no_write(B, 0);
  for (int64_t i = 0; i < padding_rows && i < B; ++i)
    is_padding[rows[i]] = 1;
  for (int64_t i = padding_rows; i < padding_rows + c.invalid_rows && i < B; ++i) {
    is_invalid[rows[i]] = 1;
  }
  const auto no_write_rows = static_cast<int64_t>(std::llround(c.no_write_fraction * B));
  for (int64_t i = 0; i < no_write_rows; ++i)
    no_write[rows[B - 1 - i]] = 1;
  std::uniform_int_distribution<int64_t> beyond(0, 1000);

  // Rows of a varlen batch with zero tokens never read their indices, so they count as nothing.
  auto has_tokens = [&](int64_t n) { return !varlen || c.varlen_lengths[n] > 0; };
  expected_invalid_ = 0;
  std::vector<int64_t> accepted(B, 1);
  if (c.indices == IndexKind::kPerRequest) {
    std::vector<uint8_t> bytes(B * dtype_size(c.index_dtype));
    for (int64_t n = 0; n < B; ++n) {
      int64_t slot = order[n];
      if (is_padding[n]) slot = -1 - beyond(rng) % 3;
      if (is_invalid[n]) slot = pool_size_ + beyond(rng);
      put_index(bytes, c.index_dtype, n, slot);
    }
    state_indices = make_view(add_buffer({"state_indices", bytes, c.index_dtype, false, 1}),
                              c.index_dtype, {B});
  } else if (c.indices == IndexKind::kPerToken) {
    std::uniform_int_distribution<int64_t> pick(1, capacity);
    std::vector<uint8_t> bytes(B * capacity * dtype_size(c.index_dtype));
    for (int64_t n = 0; n < B; ++n) {
      if (c.num_accepted_tokens) accepted[n] = pick(rng);
      for (int64_t t = 0; t < capacity; ++t) {
        int64_t slot = order[n * capacity + t];
        if (is_padding[n]) slot = -1;
        if (is_invalid[n] && t == accepted[n] - 1) slot = pool_size_ + beyond(rng);
        put_index(bytes, c.index_dtype, n * capacity + t, slot);
      }
    }
    state_indices = make_view(add_buffer({"state_indices", bytes, c.index_dtype, false, 1}),
                              c.index_dtype, {B, capacity});
    if (c.num_accepted_tokens) {
      std::vector<uint8_t> counts(B * dtype_size(c.index_dtype));
      for (int64_t n = 0; n < B; ++n)
        put_index(counts, c.index_dtype, n, accepted[n]);
      num_accepted_tokens = make_view(
          add_buffer({"num_accepted_tokens", counts, c.index_dtype, false, 1}), c.index_dtype, {B});
    }
  }
  if (c.split_pool) {
    const int64_t base = c.indices == IndexKind::kPerToken ? B * capacity : B;
    std::vector<uint8_t> bytes(B * dtype_size(c.index_dtype));
    for (int64_t n = 0; n < B; ++n) {
      int64_t slot = order[base + n];
      if (no_write[n]) slot = -1;
      // With no read index to corrupt (IndexKind::kNone), an invalid row gets a bad write index.
      if (is_invalid[n] && c.indices == IndexKind::kNone) slot = pool_size_ + beyond(rng);
      put_index(bytes, c.index_dtype, n, slot);
    }
    output_state_indices = make_view(
        add_buffer({"output_state_indices", bytes, c.index_dtype, false, 1}), c.index_dtype, {B});
  }
  for (int64_t n = 0; n < B; ++n) {
    const bool invalid_counts = is_invalid[n] && !is_padding[n] &&
                                (c.indices != IndexKind::kNone || (c.split_pool && c.update_state));
    // A request longer than the bound is invalid before its indices are looked at.
    const bool too_long =
        varlen && c.max_tokens_per_request > 0 && c.varlen_lengths[n] > c.max_tokens_per_request;
    if (too_long || (invalid_counts && has_tokens(n))) ++expected_invalid_;
  }

  if (varlen) {
    std::vector<uint8_t> bytes((B + 1) * dtype_size(c.index_dtype));
    int64_t offset = 0;
    for (int64_t n = 0; n <= B; ++n) {
      put_index(bytes, c.index_dtype, n, offset);
      if (n < B) offset += c.varlen_lengths[n];
    }
    cu_seqlens = make_view(add_buffer({"cu_seqlens", bytes, c.index_dtype, false, 1}),
                           c.index_dtype, {B + 1});
  }

  // The pool: random states, pitch possibly padded with rows nobody may touch.
  const int64_t row = vk ? K : V;
  const int64_t pitch = HV * V * K + c.slot_padding_rows * row;
  state = make_view(
      add_buffer({"state", random_floats(c.state_dtype, pool_size_ * pitch, next_seed(), 0.0, 0.5),
                  c.state_dtype, true, row}),
      c.state_dtype, {pool_size_, HV, vk ? V : K, vk ? K : V}, {pitch, V * K, row, 1});

  if (c.intermediate) {
    const std::vector<int64_t> shape = {B, capacity, HV, vk ? V : K, vk ? K : V};
    intermediate_states = make_view(
        add_buffer({"intermediate_states",
                    std::vector<uint8_t>(product(shape) * dtype_size(c.state_dtype), 0xFF),
                    c.state_dtype, true, row}),
        c.state_dtype, shape);
  }

  const std::vector<int64_t> out_shape = {dim0, dim1, HV, V};
  out = make_view(
      add_buffer({"out", std::vector<uint8_t>(product(out_shape) * dtype_size(c.out_dtype), 0xFF),
                  c.out_dtype, true, V}),
      c.out_dtype, out_shape);

  if (c.count_invalid) {
    std::vector<uint8_t> bytes(dtype_size(c.index_dtype));
    put_index(bytes, c.index_dtype, 0, 5);  // a non-zero start: hdk adds, never clears
    invalid_index_count = make_view(
        add_buffer({"invalid_index_count", bytes, c.index_dtype, true, 1}), c.index_dtype, {1});
  }
  if (c.count_nonfinite) {
    std::vector<uint8_t> bytes(dtype_size(c.index_dtype));
    put_index(bytes, c.index_dtype, 0, 7);
    nonfinite_head_count = make_view(
        add_buffer({"nonfinite_head_count", bytes, c.index_dtype, true, 1}), c.index_dtype, {1});
  }
}

double GdnCase::tolerance() const {
  if (config_.state_dtype == DType::kBFloat16) return 1e-2;
  const bool all_fp32 = config_.input_dtype == DType::kFloat32 &&
                        config_.out_dtype == DType::kFloat32 &&
                        (!config_.fused_gating || config_.gate_dtype == DType::kFloat32);
  return all_fp32 ? 1e-5 : 5e-3;
}

gdn::DecodeParams GdnCase::bind(const std::vector<void*>& bases, Device device) const {
  auto view = [&](const ViewSpec& spec) {
    if (spec.buffer < 0) return TensorView();
    char* base = static_cast<char*>(bases[spec.buffer]) +
                 spec.offset * static_cast<int64_t>(dtype_size(spec.dtype));
    return TensorView::strided(base, spec.dtype, spec.shape, spec.strides, device);
  };
  gdn::DecodeParams p;
  p.q = view(q);
  p.k = view(k);
  p.v = view(v);
  p.A_log = view(A_log);
  p.a = view(a);
  p.dt_bias = view(dt_bias);
  p.b = view(b);
  p.g = view(g);
  p.beta = view(beta);
  p.state = view(state);
  p.state_indices = view(state_indices);
  p.output_state_indices = view(output_state_indices);
  p.num_accepted_tokens = view(num_accepted_tokens);
  p.cu_seqlens = view(cu_seqlens);
  p.intermediate_states = view(intermediate_states);
  p.out = view(out);
  p.invalid_index_count = view(invalid_index_count);
  p.nonfinite_head_count = view(nonfinite_head_count);
  p.layout = config_.layout;
  p.scale = config_.scale;
  p.use_qk_l2norm = config_.use_qk_l2norm;
  p.update_state = config_.update_state;
  p.max_tokens_per_request = config_.max_tokens_per_request;
  return p;
}

BufferContents run_reference(const GdnCase& test_case, const BufferContents* initial) {
  BufferContents contents;
  std::vector<void*> bases;
  for (size_t i = 0; i < test_case.buffers().size(); ++i)
    contents.push_back(initial != nullptr ? (*initial)[i] : test_case.buffers()[i].initial);
  for (auto& bytes : contents)
    bases.push_back(bytes.data());
  gdn::decode_reference(test_case.bind(bases, Device::cpu()));
  return contents;
}

namespace {

// Copies the case's buffers (or `initial`) to the backend, runs `call` on the bound params,
// copies them back.
template <typename Call>
BufferContents run_on(const GdnCase& test_case, Backend backend, const BufferContents* initial,
                      Call&& call) {
  std::vector<DeviceBuffer> memory;
  std::vector<void*> bases;
  for (size_t i = 0; i < test_case.buffers().size(); ++i) {
    const std::vector<uint8_t>& bytes =
        initial != nullptr ? (*initial)[i] : test_case.buffers()[i].initial;
    // One spare byte keeps every base pointer distinct and non-null for empty buffers.
    memory.emplace_back(backend, bytes.size() + 1);
    memory.back().upload(bytes.data(), bytes.size());
    bases.push_back(memory.back().data());
  }
  call(test_case.bind(bases, backend_device(backend)));
  synchronize(backend);
  BufferContents contents;
  for (size_t i = 0; i < memory.size(); ++i) {
    contents.emplace_back(test_case.buffers()[i].initial.size());
    memory[i].download(contents.back().data(), contents.back().size());
  }
  return contents;
}

}  // namespace

BufferContents run_backend(const GdnCase& test_case, Backend backend,
                           const BufferContents* initial) {
  return run_on(test_case, backend, initial,
                [](const gdn::DecodeParams& params) { gdn::decode(params); });
}

#ifdef HDK_WITH_CUDA
BufferContents run_cuda_tuned(const GdnCase& test_case, const gdn::detail::LaunchOverride& tuning,
                              gdn::detail::LaunchPlan* launched, const BufferContents* initial) {
  return run_on(test_case, Backend::kCUDA, initial, [&](const gdn::DecodeParams& params) {
    const gdn::detail::LaunchPlan plan = gdn::detail::decode_tuned(params, nullptr, tuning);
    if (launched != nullptr) *launched = plan;
  });
}
#endif

::testing::AssertionResult outputs_match(const GdnCase& test_case, const BufferContents& expected,
                                         const BufferContents& actual) {
  const double tolerance = test_case.tolerance();
  for (size_t i = 0; i < test_case.buffers().size(); ++i) {
    const BufferSpec& buffer = test_case.buffers()[i];
    const std::vector<uint8_t>& want = expected[i];
    const std::vector<uint8_t>& got = actual[i];
    if (!buffer.output) {
      if (got != buffer.initial) {
        return ::testing::AssertionFailure() << "input buffer '" << buffer.name << "' was modified";
      }
      continue;
    }
    if (buffer.dtype == DType::kInt32 || buffer.dtype == DType::kInt64) {
      if (got != want) {
        int64_t want_value = 0, got_value = 0;
        std::memcpy(&want_value, want.data(), std::min<size_t>(8, want.size()));
        std::memcpy(&got_value, got.data(), std::min<size_t>(8, got.size()));
        if (buffer.dtype == DType::kInt32) {
          want_value = static_cast<int32_t>(want_value);
          got_value = static_cast<int32_t>(got_value);
        }
        return ::testing::AssertionFailure()
               << "'" << buffer.name << "' is " << got_value << ", expected " << want_value;
      }
      continue;
    }
    // Rows the reference leaves bit-identical must stay bit-identical (slots of padding rows,
    // pitch padding, intermediates of padding rows); a whole row is judged at once because a
    // written bf16 element can round back to its old value.
    const size_t element = dtype_size(buffer.dtype);
    const int64_t count = static_cast<int64_t>(want.size() / element);
    const int64_t row = buffer.row_length;
    auto row_untouched = [&](const std::vector<uint8_t>& bytes, int64_t start, int64_t end) {
      return std::memcmp(&bytes[start * element], &buffer.initial[start * element],
                         static_cast<size_t>(end - start) * element) == 0;
    };
    double sum_ref = 0.0;
    int64_t compared = 0;
    for (int64_t start = 0; start < count; start += row) {
      const int64_t end = std::min(count, start + row);
      if (row_untouched(want, start, end)) continue;
      for (int64_t e = start; e < end; ++e) {
        const double r = get_float(want, buffer.dtype, e);
        sum_ref += r * r;
        ++compared;
      }
    }
    const double rms = compared > 0 ? std::sqrt(sum_ref / compared) : 0.0;
    double sum_diff = 0.0;
    for (int64_t start = 0; start < count; start += row) {
      const int64_t end = std::min(count, start + row);
      if (row_untouched(want, start, end)) {
        if (!row_untouched(got, start, end)) {
          return ::testing::AssertionFailure()
                 << "'" << buffer.name << "' row at element " << start
                 << " was changed but the reference leaves it untouched";
        }
        continue;
      }
      // Padding rows must be exact zeros, not merely small.
      bool reference_zero = true;
      for (int64_t e = start; e < end && reference_zero; ++e) {
        reference_zero = get_float(want, buffer.dtype, e) == 0.0;
      }
      if (reference_zero) {
        for (int64_t e = start; e < end; ++e) {
          if (get_float(got, buffer.dtype, e) != 0.0) {
            return ::testing::AssertionFailure()
                   << "'" << buffer.name << "' element " << e << " is "
                   << get_float(got, buffer.dtype, e) << " but must be exactly 0 (padding row)";
          }
        }
        continue;
      }
      double row_diff = 0.0, row_ref = 0.0;
      for (int64_t e = start; e < end; ++e) {
        const double r = get_float(want, buffer.dtype, e);
        const double x = get_float(got, buffer.dtype, e);
        if (!std::isfinite(x)) {
          return ::testing::AssertionFailure()
                 << "'" << buffer.name << "' element " << e << " is " << x << " (expected " << r
                 << "): unwritten or overflowed";
        }
        row_diff += (x - r) * (x - r);
        row_ref += r * r;
      }
      sum_diff += row_diff;
      const double floor = 0.1 * rms * std::sqrt(static_cast<double>(end - start));
      const double row_error = std::sqrt(row_diff) / std::max(std::sqrt(row_ref), floor + 1e-30);
      if (row_error > 4.0 * tolerance) {
        return ::testing::AssertionFailure()
               << "'" << buffer.name << "' row at element " << start << " has relative error "
               << row_error << " > " << 4.0 * tolerance;
      }
    }
    const double error = sum_ref > 0 ? std::sqrt(sum_diff / sum_ref) : std::sqrt(sum_diff);
    if (error > tolerance) {
      return ::testing::AssertionFailure()
             << "'" << buffer.name << "' relative error " << error << " > " << tolerance;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace hdk
