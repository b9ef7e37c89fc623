// hdk-bench gdn: GDN decode time, achieved bandwidth and its fraction of the copy bandwidth
// measured in the same run, over presets x batch x T x state dtype; optional oracle check.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_cli.h"
#include "bench_device.h"
#include "core/float_convert.h"
#include "gdn/reference/decode_reference.h"
#include "hdk/error.h"
#include "hdk/gdn/decode.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "gdn/cuda/decode_cuda.h"
#include "gdn/decode_validation.h"
#endif

namespace hdk {
namespace bench {
namespace {

struct Preset {
  const char* name;
  const char* model;
  int64_t H, HV, K, V;
};

const Preset kPresets[] = {
    {"qwen3.5-397b", "Qwen3.5-397B", 16, 64, 128, 128},
    {"qwen3.5-397b-tp2", "Qwen3.5-397B, TP=2 shard", 8, 32, 128, 128},
    {"qwen3.5-397b-tp4", "Qwen3.5-397B, TP=4 shard", 4, 16, 128, 128},
    {"qwen3.5-397b-tp8", "Qwen3.5-397B, TP=8 shard", 2, 8, 128, 128},
    {"qwen3-next", "Qwen3-Next-80B", 16, 32, 128, 128},
    {"qwen3.5-35b", "Qwen3.5-35B", 16, 32, 128, 128},
    {"qwen3.5-27b", "Qwen3.5-27B", 16, 48, 128, 128},
};

DType parse_dtype(const char* option, const std::string& name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  throw std::runtime_error(std::string(option) + ": unknown dtype '" + name +
                           "' (fp32, bf16, fp16)");
}

// Deterministic non-zero values in [-1, 1) without the cost of a normal generator.
void fill_random(std::vector<uint8_t>& bytes, DType dtype, uint64_t seed, double scale) {
  const size_t count = bytes.size() / dtype_size(dtype);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const double unit = static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
    const auto value = static_cast<float>((2.0 * unit - 1.0) * scale);
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &value, 4);
    } else {
      const uint16_t half =
          dtype == DType::kBFloat16 ? detail::float_to_bf16(value) : detail::float_to_half(value);
      std::memcpy(bytes.data() + 2 * i, &half, 2);
    }
  }
}

double to_double(const uint8_t* bytes, DType dtype, size_t i) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, bytes + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  return dtype == DType::kBFloat16 ? detail::bf16_to_float(h) : detail::half_to_float(h);
}

double relative_error(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                      DType dtype) {
  double diff = 0.0, ref = 0.0;
  const size_t count = want.size() / dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    const double r = to_double(want.data(), dtype, i);
    const double x = to_double(got.data(), dtype, i);
    if (!std::isfinite(x)) return INFINITY;
    diff += (x - r) * (x - r);
    ref += r * r;
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

struct Config {
  Preset preset;
  int64_t B, T;
  DType state, input;
  gdn::StateLayout layout;
  bool verify_mode;  // intermediates cached, pool not updated (speculative verify)
  // T = 1 in SGLang's decode form: [1, B] tokens, cu_seqlens = 0..B, max_tokens_per_request = 1.
  bool cu_seqlens_form;
  // No state_indices: request n reads and writes slot n of a pool of B states (FLA's call
  // form, where the caller gathered the states; the pool index's cost, by difference).
  bool no_indices;
};

struct Buffers {
  std::vector<uint8_t> q, k, v, a, b, A_log, dt_bias, indices, cu_seqlens, state, out, cache;
};

struct Measurement {
  double time_us = 0, bytes = 0, state_bytes = 0, out_error = -1, state_error = -1;
  std::string launch = "-";  // the CUDA dispatcher's choice
};

// "vks w4 r4 l16 x2 2048" = kernel, warps per CTA, rows per thread, lanes per row, tiles per
// head, CTAs; " common" where the short kernel takes the common form's parameter block.
#ifdef HDK_WITH_CUDA
std::string describe_launch(const gdn::detail::LaunchPlan& plan) {
  return std::string(gdn::detail::decode_kernel_name(plan.kernel)) + " w" +
         std::to_string(plan.warps_per_cta) + " r" + std::to_string(plan.rows_per_thread) + " l" +
         std::to_string(plan.lanes_per_row) + " x" + std::to_string(plan.tiles_per_head) + " " +
         std::to_string(plan.ctas) + (plan.common_form ? " common" : "");
}
#endif

class GdnBench {
 public:
  GdnBench(BenchDevice& device, const TimingOptions& timing, bool verify, int64_t verify_limit)
      : device_(device), timing_(timing), verify_(verify), verify_limit_(verify_limit) {}

  Measurement run(const Config& c) {
    const int64_t B = c.B, T = c.T, H = c.preset.H, HV = c.preset.HV, K = c.preset.K,
                  V = c.preset.V;
    const bool vk = c.layout == gdn::StateLayout::kVK;
    const size_t in_size = dtype_size(c.input), state_size = dtype_size(c.state);
    const int64_t P = B;
    const int64_t matrix = V * K;

    Buffers host;
    host.q.resize(B * T * H * K * in_size);
    host.k.resize(host.q.size());
    host.v.resize(B * T * HV * V * in_size);
    host.a.resize(B * T * HV * in_size);
    host.b.resize(host.a.size());
    host.A_log.resize(HV * 4);
    host.dt_bias.resize(HV * 4);
    fill_random(host.q, c.input, 1, 1.0);
    fill_random(host.k, c.input, 2, 1.0);
    fill_random(host.v, c.input, 3, 1.0);
    fill_random(host.a, c.input, 4, 2.0);
    fill_random(host.b, c.input, 5, 2.0);
    fill_random(host.A_log, DType::kFloat32, 6, 1.5);
    fill_random(host.dt_bias, DType::kFloat32, 7, 1.0);
    // Slots in random order, as a serving engine's pool hands them out.
    std::vector<int32_t> slots(B);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(11));
    host.indices.resize(B * 4);
    std::memcpy(host.indices.data(), slots.data(), host.indices.size());
    std::vector<int32_t> offsets(B + 1);
    std::iota(offsets.begin(), offsets.end(), 0);
    host.cu_seqlens.resize((B + 1) * 4);
    std::memcpy(host.cu_seqlens.data(), offsets.data(), host.cu_seqlens.size());
    const size_t pool_bytes = static_cast<size_t>(P * HV * matrix) * state_size;
    const size_t cache_bytes =
        c.verify_mode ? static_cast<size_t>(B * T) * HV * matrix * state_size : 0;
    const size_t out_bytes = static_cast<size_t>(B * T * HV * V) * in_size;

    DeviceAllocation q(device_, host.q.size()), k(device_, host.k.size()),
        v(device_, host.v.size()), a(device_, host.a.size()), b(device_, host.b.size()),
        A_log(device_, host.A_log.size()), dt_bias(device_, host.dt_bias.size()),
        indices(device_, host.indices.size()), cu_seqlens(device_, host.cu_seqlens.size()),
        state(device_, pool_bytes), out(device_, out_bytes), cache(device_, cache_bytes);
    device_.upload(q.get(), host.q.data(), host.q.size());
    device_.upload(k.get(), host.k.data(), host.k.size());
    device_.upload(v.get(), host.v.data(), host.v.size());
    device_.upload(a.get(), host.a.data(), host.a.size());
    device_.upload(b.get(), host.b.data(), host.b.size());
    device_.upload(A_log.get(), host.A_log.data(), host.A_log.size());
    device_.upload(dt_bias.get(), host.dt_bias.data(), host.dt_bias.size());
    device_.upload(indices.get(), host.indices.data(), host.indices.size());
    device_.upload(cu_seqlens.get(), host.cu_seqlens.data(), host.cu_seqlens.size());
    upload_pool(state.get(), pool_bytes, c.state);

    const Device where = device_.device();
    gdn::DecodeParams p;
    p.q = TensorView::contiguous(q.get(), c.input, {B, T, H, K}, where);
    p.k = TensorView::contiguous(k.get(), c.input, {B, T, H, K}, where);
    p.v = TensorView::contiguous(v.get(), c.input, {B, T, HV, V}, where);
    p.a = TensorView::contiguous(a.get(), c.input, {B, T, HV}, where);
    p.b = TensorView::contiguous(b.get(), c.input, {B, T, HV}, where);
    p.A_log = TensorView::contiguous(A_log.get(), DType::kFloat32, {HV}, where);
    p.dt_bias = TensorView::contiguous(dt_bias.get(), DType::kFloat32, {HV}, where);
    if (!c.no_indices) {
      p.state_indices = TensorView::contiguous(indices.get(), DType::kInt32, {B}, where);
    }
    p.state = TensorView::contiguous(state.get(), c.state, {P, HV, vk ? V : K, vk ? K : V}, where);
    p.out = TensorView::contiguous(out.get(), c.input, {B, T, HV, V}, where);
    p.layout = c.layout;
    if (c.cu_seqlens_form) {
      // The same tensors as [1, B] tokens, request n owning token n.
      for (TensorView* view : {&p.q, &p.k, &p.v, &p.a, &p.b, &p.out}) {
        view->shape[1] *= view->shape[0];
        view->shape[0] = 1;
        view->strides[0] = view->strides[1] * view->shape[1];
      }
      p.cu_seqlens = TensorView::contiguous(cu_seqlens.get(), DType::kInt32, {B + 1}, where);
      p.max_tokens_per_request = 1;
    }
    if (c.verify_mode) {
      p.intermediate_states =
          TensorView::contiguous(cache.get(), c.state, {B, T, HV, vk ? V : K, vk ? K : V}, where);
      p.update_state = false;
    }

    Measurement m;
    if (verify_ && B <= verify_limit_) verify(c, p, host, pool_bytes, out_bytes, cache_bytes, &m);

    m.time_us = device_.time_us([&](CudaStream stream) { decode(p, stream); }, timing_);
#ifdef HDK_WITH_CUDA
    if (where.is_cuda()) m.launch = describe_launch(launched_);  // what the timed calls ran
#endif
    m.state_bytes = static_cast<double>(pool_bytes);
    m.bytes = static_cast<double>(pool_bytes) * (c.verify_mode ? 1 : 2) +
              static_cast<double>(cache_bytes) + static_cast<double>(out_bytes) +
              static_cast<double>(host.q.size() + host.k.size() + host.v.size() + host.a.size() +
                                  host.b.size() + (c.no_indices ? 0 : host.indices.size()));
    return m;
  }

#ifdef HDK_WITH_CUDA
  // The kernel choices hdk-bench's tuning options force (CUDA calls only).
  void set_tuning(const gdn::detail::LaunchOverride& tuning) {
    tuning_ = tuning;
  }
#endif

 private:
  void decode(const gdn::DecodeParams& p, CudaStream stream) {
#ifdef HDK_WITH_CUDA
    if (p.q.device.is_cuda()) {
      launched_ = gdn::detail::decode_tuned(p, stream, tuning_);
      return;
    }
#endif
    gdn::decode(p, stream);
  }

  // Fills the pool from one random block repeated: non-zero everywhere, cheap at many GiB.
  void upload_pool(void* pool, size_t bytes, DType dtype) {
    const size_t block = std::min(bytes, size_t{16} << 20);
    if (pool_block_.size() != block || pool_block_dtype_ != dtype) {
      pool_block_.resize(block);
      fill_random(pool_block_, dtype, 99, 0.5);
      pool_block_dtype_ = dtype;
    }
    for (size_t offset = 0; offset < bytes; offset += block) {
      device_.upload(static_cast<char*>(pool) + offset, pool_block_.data(),
                     std::min(block, bytes - offset));
    }
  }

  void verify(const Config& c, const gdn::DecodeParams& p, Buffers& host, size_t pool_bytes,
              size_t out_bytes, size_t cache_bytes, Measurement* m) {
    // One step on the device from a known pool, then the float64 oracle on host copies.
    upload_pool(p.state.data, pool_bytes, c.state);
    decode(p, nullptr);
    std::vector<uint8_t> got_out(out_bytes), got_state(pool_bytes), got_cache(cache_bytes);
    device_.download(got_out.data(), p.out.data, out_bytes);
    device_.download(got_state.data(), p.state.data, pool_bytes);
    if (cache_bytes) device_.download(got_cache.data(), p.intermediate_states.data, cache_bytes);

    host.state.resize(pool_bytes);
    for (size_t offset = 0; offset < pool_bytes; offset += pool_block_.size()) {
      std::memcpy(host.state.data() + offset, pool_block_.data(),
                  std::min(pool_block_.size(), pool_bytes - offset));
    }
    host.out.assign(out_bytes, 0xFF);
    host.cache.assign(cache_bytes, 0xFF);
    gdn::DecodeParams ref = p;
    auto rebind = [](TensorView view, void* data) {
      view.data = data;
      view.device = Device::cpu();
      return view;
    };
    ref.q = rebind(p.q, host.q.data());
    ref.k = rebind(p.k, host.k.data());
    ref.v = rebind(p.v, host.v.data());
    ref.a = rebind(p.a, host.a.data());
    ref.b = rebind(p.b, host.b.data());
    ref.A_log = rebind(p.A_log, host.A_log.data());
    ref.dt_bias = rebind(p.dt_bias, host.dt_bias.data());
    if (p.state_indices.defined()) {
      ref.state_indices = rebind(p.state_indices, host.indices.data());
    }
    if (p.cu_seqlens.defined()) ref.cu_seqlens = rebind(p.cu_seqlens, host.cu_seqlens.data());
    ref.state = rebind(p.state, host.state.data());
    ref.out = rebind(p.out, host.out.data());
    if (cache_bytes) ref.intermediate_states = rebind(p.intermediate_states, host.cache.data());
    gdn::decode_reference(ref);
    m->out_error = relative_error(got_out, host.out, c.input);
    m->state_error = cache_bytes ? relative_error(got_cache, host.cache, c.state)
                                 : relative_error(got_state, host.state, c.state);
    // The pool was left at one step past the pattern; restore it for the timed runs.
    upload_pool(p.state.data, pool_bytes, c.state);
  }

  BenchDevice& device_;
  TimingOptions timing_;
  bool verify_;
  int64_t verify_limit_;
  std::vector<uint8_t> pool_block_;
  DType pool_block_dtype_ = DType::kUInt8;
#ifdef HDK_WITH_CUDA
  gdn::detail::LaunchOverride tuning_;
  gdn::detail::LaunchPlan launched_;
#endif
};

double tolerance_for(DType state, DType input) {
  if (state == DType::kBFloat16) return 1e-2;
  return input == DType::kFloat32 ? 1e-5 : 5e-3;
}

// Every name in `names` as a preset; an unknown one is an error that lists the presets.
std::vector<const Preset*> find_presets(const std::vector<std::string>& names) {
  std::vector<const Preset*> presets;
  for (const std::string& name : names) {
    const Preset* found = nullptr;
    for (const Preset& preset : kPresets) {
      if (name == preset.name) found = &preset;
    }
    if (found == nullptr) {
      std::string valid;
      for (const Preset& preset : kPresets)
        valid += (valid.empty() ? "" : ", ") + std::string(preset.name);
      throw std::runtime_error("--preset: unknown preset '" + name + "' (presets: " + valid + ")");
    }
    presets.push_back(found);
  }
  return presets;
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string text;
  for (const std::string& item : items)
    text += (text.empty() ? "" : separator) + item;
  return text;
}

std::vector<std::string> as_texts(const std::vector<int64_t>& values) {
  std::vector<std::string> texts;
  for (int64_t value : values)
    texts.push_back(std::to_string(value));
  return texts;
}

// The shapes a run measures, as the header prints them and as the JSON's "shapes" field.
struct RunShapes {
  std::vector<const Preset*> presets;
  std::vector<int64_t> batches, tokens;
  std::vector<std::string> states;
  std::string input, layout;

  void print() const {
    for (const Preset* preset : presets) {
      std::printf("preset %s (%s): H=%lld HV=%lld K=%lld V=%lld\n", preset->name, preset->model,
                  static_cast<long long>(preset->H), static_cast<long long>(preset->HV),
                  static_cast<long long>(preset->K), static_cast<long long>(preset->V));
    }
    std::printf(
        "B %s; T %s; state %s; q, k, v, a, b, out %s; pool layout %s, one slot per request\n\n",
        join(as_texts(batches), ",").c_str(), join(as_texts(tokens), ",").c_str(),
        join(states, ",").c_str(), input.c_str(), layout.c_str());
  }

  std::string json() const {
    std::vector<std::string> preset_records, state_names;
    for (const Preset* preset : presets) {
      preset_records.push_back(
          "{\"name\": \"" + std::string(preset->name) + "\", \"H\": " + std::to_string(preset->H) +
          ", \"HV\": " + std::to_string(preset->HV) + ", \"K\": " + std::to_string(preset->K) +
          ", \"V\": " + std::to_string(preset->V) + "}");
    }
    for (const std::string& state : states)
      state_names.push_back("\"" + state + "\"");
    return "{\"presets\": [" + join(preset_records, ", ") + "], \"B\": [" +
           join(as_texts(batches), ", ") + "], \"T\": [" + join(as_texts(tokens), ", ") +
           "], \"state\": [" + join(state_names, ", ") + "], \"input\": \"" + input +
           "\", \"layout\": \"" + layout + "\"}";
  }
};

// The columns' meaning, the oracle check's thresholds among them.
std::string legend(DType input) {
  char thresholds[160];
  std::snprintf(thresholds, sizeof(thresholds), "bf16 state %g, fp32 state %g (%s inputs)",
                tolerance_for(DType::kBFloat16, input), tolerance_for(DType::kFloat32, input),
                dtype_name(input));
  return std::string(
             "GB/s = minimal bytes (state read + write or cache, q, k, v, a, b, out, indices) / "
             "time;\n%copy = GB/s / copy_GB/s, the copy bandwidth (CPU, cold: before each of this "
             "point's timed\ncalls one of the methods above, in turn, and the best method's "
             "median; the in-place\nread-modify-write a step does to its state is among them; "
             "GPU: device-to-device copy\nat the start of the run); a few % above 100 is the two "
             "medians' noise, not a step\nfaster than memory;"
             "\nx_floor = time / (empty launch + bytes / copy bw): below 1 where %copy is above "
             "100;\nerr_out, err_state = relative error against the float64 oracle, "
             "||got - oracle|| / ||oracle||,\nof out and of the updated pool (verify mode: the "
             "cached intermediate states);\ncheck = ok when both are at most the threshold: ") +
         thresholds + ";\n'-' = not checked (no --verify, or B above --verify-max-batch)";
}

void print_usage() {
  std::printf(
      "hdk-bench gdn [options]\n"
      "  --preset NAME[,NAME]  shapes (default qwen3.5-397b):");
  for (const Preset& preset : kPresets)
    std::printf(" %s", preset.name);
  std::printf(
      "\n"
      "  --batch LIST          requests per step, e.g. 1,8,64 or 1-512 (powers of two)\n"
      "  --T LIST              tokens per request (T > 1 runs the verify pass: cache on,\n"
      "                        pool not updated; --mode decode forces updates)\n"
      "  --state fp32,bf16     state dtypes      --input bf16|fp16|fp32 (q, k, v, a, b, out)\n"
      "  --layout vk|kv        pool layout       --mode auto|decode|verify\n"
      "  --hot                 keep caches warm between runs (default: flushed, cold)\n"
      "  --flush-code          also evict the SMs' instruction caches before each run (the\n"
      "                        L2 flush leaves them holding the last replay's code)\n"
      "  --iterations N        timed runs per point (median)\n"
      "  --verify              check each point once against the float64 oracle\n"
      "  --verify-max-batch N  skip the oracle above this batch (default 64)\n"
      "  --json FILE           also write results as JSON\n"
      "  --cpu                 run on the CPU even when a GPU is present\n"
      "  --warps N             force warps per CTA (tuning sweeps): short kernel 1-4,\n"
      "                        one-token sweep kernel 1-8\n"
      "  --rows-per-thread N   force the VK kernels' rows per thread (tuning): short and\n"
      "                        general kernels 2, 4 or 8; one-token sweep kernel 4, 8 or 16\n"
      "  --lanes-per-row N     force the short and general kernels' lanes per state row\n"
      "                        (tuning, K = 128: bf16 8 or 16, fp32 16 or 32)\n"
      "  --vk-kernel short|general\n"
      "                        which kernel runs the VK calls both take (default: the\n"
      "                        dispatcher's); short takes up to 32 tokens per request\n"
      "  --one-token-sweep-kernel\n"
      "                        T = 1 on the one-token sweep kernel (tuning; built with\n"
      "                        -DHDK_GDN_SWEEP_KERNELS=ON)\n"
      "  --wide-offsets        short kernel: 64-bit token offsets even where 32 bits fit\n"
      "  --short-build token-loop|one-token\n"
      "                        short kernel, T = 1: the build with or without the token loop\n"
      "                        (without: bf16 state, or fp32 in the common form; default: the\n"
      "                        dispatcher's, by the heads)\n"
      "  --load-order inputs-first|state-first\n"
      "                        short kernel, T = 1: load the token's inputs or the state first\n"
      "                        (state first: fp32 state in the common form's one-token build;\n"
      "                        default: the dispatcher's, by how much of one wave the grid fills)\n"
      "  --cu-seqlens          T = 1 in SGLang's decode form: [1, B] tokens with cu_seqlens\n"
      "                        = 0..B and max_tokens_per_request = 1\n"
      "  --full-problem        short kernel: the full parameter block even for calls of the\n"
      "                        common form (A/B of the compact block)\n"
      "  --no-indices          no state_indices: request n updates slot n (FLA's call form,\n"
      "                        states gathered by the caller; the index's cost by difference)\n");
}

}  // namespace

int gdn_command(Options& options) {
  if (options.flag("help")) {
    print_usage();
    return 0;
  }
  std::unique_ptr<BenchDevice> device = BenchDevice::create(options.flag("cpu"));
  const bool gpu = device->device().is_cuda();
  const std::vector<const Preset*> presets =
      find_presets(options.texts("preset", {"qwen3.5-397b"}));
  const std::vector<int64_t> default_batches =
      gpu ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
          : std::vector<int64_t>{1, 8, 32};
  const std::vector<int64_t> batches = options.integers("batch", default_batches);
  const std::vector<int64_t> tokens =
      options.integers("T", gpu ? std::vector<int64_t>{1, 2, 4, 8} : std::vector<int64_t>{1});
  const std::vector<std::string> states = options.texts("state", {"bf16", "fp32"});
  for (const std::string& state : states)
    parse_dtype("--state", state);
  const DType input = parse_dtype("--input", options.text("input", "bf16"));
  const std::string layout_name = options.text("layout", "vk");
  const std::string mode = options.text("mode", "auto");
  const bool verify = options.flag("verify");
  const int64_t verify_limit = options.integer("verify-max-batch", 64);
  TimingOptions timing;
  timing.flush_cache = !options.flag("hot");
  timing.flush_code = options.flag("flush-code");
  timing.iterations = static_cast<int>(options.integer("iterations", gpu ? 50 : 15));
  const std::string json_path = options.text("json", "");
  const int64_t forced_warps = options.integer("warps", 0);
  const int64_t forced_rows = options.integer("rows-per-thread", 0);
  const int64_t forced_lanes = options.integer("lanes-per-row", 0);
  const std::string vk_kernel = options.text("vk-kernel", "");
  const bool one_token_sweep = options.flag("one-token-sweep-kernel");
  const bool wide_offsets = options.flag("wide-offsets");
  const std::string short_build = options.text("short-build", "");
  const bool full_problem = options.flag("full-problem");
  const std::string load_order = options.text("load-order", "");
  const bool cu_seqlens_form = options.flag("cu-seqlens");
  const bool no_indices = options.flag("no-indices");
  if (!short_build.empty() && short_build != "token-loop" && short_build != "one-token") {
    throw std::runtime_error("--short-build token-loop|one-token");
  }
  if (!load_order.empty() && load_order != "inputs-first" && load_order != "state-first") {
    throw std::runtime_error("--load-order inputs-first|state-first");
  }
  if (!vk_kernel.empty() && vk_kernel != "short" && vk_kernel != "general") {
    throw std::runtime_error("--vk-kernel short|general");
  }
  if (cu_seqlens_form && (tokens.size() != 1 || tokens[0] != 1)) {
    throw std::runtime_error("--cu-seqlens runs T = 1 only (SGLang's decode form): add --T 1");
  }
  options.reject_unused();
#ifdef HDK_WITH_CUDA
  gdn::detail::LaunchOverride forced;
  forced.warps = static_cast<int>(forced_warps);
  forced.rows_per_thread = static_cast<int>(forced_rows);
  forced.lanes_per_row = static_cast<int>(forced_lanes);
  forced.one_token_sweep = one_token_sweep;
  if (vk_kernel == "short") forced.vk_kernel = gdn::detail::VKKernel::kShort;
  if (vk_kernel == "general") forced.vk_kernel = gdn::detail::VKKernel::kGeneral;
  forced.wide_offsets = wide_offsets;
  if (short_build == "token-loop") forced.short_build = gdn::detail::ShortBuild::kTokenLoop;
  if (short_build == "one-token") forced.short_build = gdn::detail::ShortBuild::kOneToken;
  forced.full_problem = full_problem;
  if (load_order == "inputs-first") forced.load_order = gdn::detail::ShortLoadOrder::kInputsFirst;
  if (load_order == "state-first") forced.load_order = gdn::detail::ShortLoadOrder::kStateFirst;
#else
  if (forced_warps != 0 || forced_rows != 0 || forced_lanes != 0 || !vk_kernel.empty() ||
      one_token_sweep || wide_offsets || !short_build.empty() || full_problem ||
      !load_order.empty()) {
    throw std::runtime_error("the kernel tuning options need the CUDA backend");
  }
#endif
  if (layout_name != "vk" && layout_name != "kv") throw std::runtime_error("--layout vk|kv");
  if (mode != "auto" && mode != "decode" && mode != "verify") {
    throw std::runtime_error("--mode auto|decode|verify");
  }
  for (const auto& [name, values] : {std::pair{"--batch", &batches}, std::pair{"--T", &tokens}}) {
    for (int64_t value : *values) {
      if (value < 1) {
        throw std::runtime_error(std::string(name) + " takes values >= 1, got " +
                                 std::to_string(value));
      }
    }
  }

  const RunBaseline baseline = start_run(*device, "gdn", timing);
  const RunShapes shapes{presets, batches, tokens, states, dtype_name(input), layout_name};
  shapes.print();
  const double copy_gbs = baseline.copy_gbs;
  const double overhead_us = baseline.launch_overhead_us;

  // On a GPU the last column says which kernel the timed calls launched (its shape and grid).
  std::vector<std::string> columns = {"preset",  "B",         "T",     "state",     "mode",
                                      "time_us", "GB/s",      "%copy", "copy_GB/s", "x_floor",
                                      "err_out", "err_state", "check"};
  if (gpu) columns.push_back("launch");
  ResultTable table(columns);
  GdnBench bench(*device, timing, verify, verify_limit);
#ifdef HDK_WITH_CUDA
  bench.set_tuning(forced);
#endif
  int failures = 0;
  const size_t total = presets.size() * batches.size() * tokens.size() * states.size();
  size_t done = 0;
  for (const Preset* preset : presets) {
    for (const std::string& state_name : states) {
      for (int64_t T : tokens) {
        for (int64_t B : batches) {
          Config c{*preset,
                   B,
                   T,
                   parse_dtype("--state", state_name),
                   input,
                   layout_name == "vk" ? gdn::StateLayout::kVK : gdn::StateLayout::kKV,
                   mode == "verify" || (mode == "auto" && T > 1),
                   cu_seqlens_form,
                   no_indices};
          ++done;
          report_progress("[" + std::to_string(done) + "/" + std::to_string(total) + "] " +
                          preset->name + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
                          " " + state_name);
          Measurement m;
          try {
            m = bench.run(c);
          } catch (const std::exception& error) {
            clear_progress();
            std::fprintf(stderr, "%s B=%lld T=%lld: %s\n", preset->name, static_cast<long long>(B),
                         static_cast<long long>(T), error.what());
            table.add_row({preset->name, std::to_string(B), std::to_string(T), state_name,
                           c.verify_mode ? "verify" : "decode", "error"});
            ++failures;
            continue;
          }
          // Where the copy was measured between this point's timed calls (CPU, cold), the point
          // is judged against that; otherwise against the run's start.
          const double point_copy_gbs =
              device->interleaved_copy_gbs() > 0 ? device->interleaved_copy_gbs() : copy_gbs;
          const double gbs = m.bytes / (m.time_us * 1e-6) / 1e9;
          const double floor_us = overhead_us + m.bytes / (point_copy_gbs * 1e9) * 1e6;
          std::string check = "-";
          if (m.out_error >= 0) {
            const double tolerance = tolerance_for(c.state, c.input);
            const bool ok = m.out_error <= tolerance && m.state_error <= tolerance;
            check = ok ? "ok" : "FAIL";
            if (!ok) ++failures;
          }
          std::vector<std::string> row = {preset->name,
                                          std::to_string(B),
                                          std::to_string(T),
                                          state_name,
                                          c.verify_mode ? "verify" : "decode",
                                          format(m.time_us, 2),
                                          format(gbs, 1),
                                          format(100.0 * gbs / point_copy_gbs, 1),
                                          format(point_copy_gbs, 1),
                                          format(m.time_us / floor_us, 2),
                                          m.out_error >= 0 ? format(m.out_error, 7) : "-",
                                          m.state_error >= 0 ? format(m.state_error, 7) : "-",
                                          check};
          if (gpu) row.push_back(m.launch);
          table.add_row(std::move(row));
        }
      }
    }
  }
  return finish_run(table, legend(input).c_str(), options, json_path, *device, baseline, timing,
                    failures, {{"shapes", shapes.json()}});
}

}  // namespace bench
}  // namespace hdk
