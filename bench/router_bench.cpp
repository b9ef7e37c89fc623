// hdk-bench router: the DeepSeek-V4 router on the decode path (Flash and Pro gate shapes) over
// N rows: time per call (CUDA-graph replay, L2 flushed before each), gate_weight bytes / time
// as % of the copy bandwidth measured in the same run, x_floor against launch overhead + bytes
// at copy bandwidth, and an optional check against the float64 oracle.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "bench_device.h"
#include "core/float_convert.h"
#include "dsv4/router/reference/router_reference.h"
#include "hdk/dsv4/router.h"
#include "hdk/error.h"

namespace hdk {
namespace bench {
namespace {

struct RouterPreset {
  const char* name;
  const char* model;
  int64_t E, D;
  float route_scale;
};

const RouterPreset kRouterPresets[] = {
    {"flash", "DeepSeek-V4 Flash", 256, 4096, 1.5f},
    {"pro", "DeepSeek-V4 Pro", 384, 7168, 2.5f},
};

constexpr int64_t kVocab = 129280;
constexpr int64_t kRouterTopK = 6;

// Deterministic values in [-scale, scale) without the cost of a normal generator.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  double next(double scale) {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return (2.0 * static_cast<double>(state_ >> 11) * (1.0 / 9007199254740992.0) - 1.0) * scale;
  }
  uint64_t bits() {
    next(1.0);
    return state_;
  }

 private:
  uint64_t state_;
};

enum class Path { kFused, kLogits, kHash };

Path parse_path(const std::string& name) {
  if (name == "fused") return Path::kFused;
  if (name == "logits") return Path::kLogits;
  if (name == "hash") return Path::kHash;
  throw std::runtime_error("unknown --path '" + name + "' (fused, logits, hash)");
}

struct Measurement {
  double time_us = 0;
  double gate_bytes = 0;  // bytes of gate_weight read per call (0 on the logits path)
  double bytes = 0;       // bytes the floor counts
  std::string check = "-";
  double weight_error = -1;
  int64_t near_ties = 0;
};

class RouterBench {
 public:
  RouterBench(BenchDevice& device, const TimingOptions& timing, bool verify)
      : device_(device), timing_(timing), verify_(verify) {}

  Measurement run(const RouterPreset& preset, int64_t N, Path path) {
    const int64_t E = preset.E, D = preset.D, K = kRouterTopK;
    Random random(static_cast<uint64_t>(N * 7919 + E));
    std::vector<uint16_t> hidden(N * D), gate(E * D);
    for (auto& value : hidden)
      value = detail::float_to_bf16(static_cast<float>(random.next(1.0)));
    const double weight_scale = 2.0 / std::sqrt(static_cast<double>(D));
    for (auto& value : gate)
      value = detail::float_to_bf16(static_cast<float>(random.next(weight_scale)));
    std::vector<float> bias(E), logits(N * E);
    for (auto& value : bias)
      value = static_cast<float>(random.next(0.5));
    for (auto& value : logits)
      value = static_cast<float>(random.next(4.0));
    std::vector<int32_t> tokens(N), table(kVocab * K);
    for (auto& value : tokens)
      value = static_cast<int32_t>(random.bits() % kVocab);
    for (auto& value : table)
      value = static_cast<int32_t>(random.bits() % E);

    const bool fused = path != Path::kLogits;
    const bool hash = path == Path::kHash;
    const int64_t slabs = dsv4::route_workspace_slabs(N);
    DeviceAllocation d_hidden(device_, hidden.size() * 2), d_gate(device_, gate.size() * 2),
        d_bias(device_, bias.size() * 4), d_logits(device_, logits.size() * 4),
        d_tokens(device_, tokens.size() * 4), d_table(device_, hash ? table.size() * 4 : 0),
        d_ids(device_, N * K * 4), d_weights(device_, N * K * 4),
        d_workspace(device_, slabs * N * E * 4), d_counter(device_, 8);
    device_.upload(d_hidden.get(), hidden.data(), hidden.size() * 2);
    device_.upload(d_gate.get(), gate.data(), gate.size() * 2);
    device_.upload(d_bias.get(), bias.data(), bias.size() * 4);
    device_.upload(d_logits.get(), logits.data(), logits.size() * 4);
    device_.upload(d_tokens.get(), tokens.data(), tokens.size() * 4);
    if (hash) device_.upload(d_table.get(), table.data(), table.size() * 4);
    const int64_t zero = 0;
    device_.upload(d_counter.get(), &zero, 8);

    const Device where = device_.device();
    dsv4::RouterParams p;
    if (fused) {
      p.hidden = TensorView::contiguous(d_hidden.get(), DType::kBFloat16, {N, D}, where);
      p.gate_weight = TensorView::contiguous(d_gate.get(), DType::kBFloat16, {E, D}, where);
      p.logits_workspace =
          TensorView::contiguous(d_workspace.get(), DType::kFloat32, {slabs, N, E}, where);
    } else {
      p.logits = TensorView::contiguous(d_logits.get(), DType::kFloat32, {N, E}, where);
    }
    if (hash) {
      p.token_ids = TensorView::contiguous(d_tokens.get(), DType::kInt32, {N}, where);
      p.tid2eid = TensorView::contiguous(d_table.get(), DType::kInt32, {kVocab, K}, where);
    } else {
      p.bias = TensorView::contiguous(d_bias.get(), DType::kFloat32, {E}, where);
    }
    p.topk_ids = TensorView::contiguous(d_ids.get(), DType::kInt32, {N, K}, where);
    p.topk_weights = TensorView::contiguous(d_weights.get(), DType::kFloat32, {N, K}, where);
    p.invalid_count = TensorView::contiguous(d_counter.get(), DType::kInt64, {1}, where);
    p.top_k = K;
    p.route_scale = preset.route_scale;

    Measurement m;
    if (verify_) {
      dsv4::route(p);
      std::vector<int32_t> ids(N * K);
      std::vector<float> weights(N * K), workspace(fused ? N * E : 0);
      device_.download(ids.data(), d_ids.get(), ids.size() * 4);
      device_.download(weights.data(), d_weights.get(), weights.size() * 4);
      if (fused) device_.download(workspace.data(), d_workspace.get(), workspace.size() * 4);
      dsv4::RouterParams host = p;
      auto rebind = [](TensorView view, void* data) {
        view.data = data;
        view.device = Device::cpu();
        return view;
      };
      std::vector<int32_t> host_ids(N * K);
      std::vector<float> host_weights(N * K), host_workspace(slabs * N * E);
      int64_t host_counter = 0;
      if (fused) {
        host.hidden = rebind(p.hidden, hidden.data());
        host.gate_weight = rebind(p.gate_weight, gate.data());
        host.logits_workspace = rebind(p.logits_workspace, host_workspace.data());
      } else {
        host.logits = rebind(p.logits, logits.data());
      }
      if (hash) {
        host.token_ids = rebind(p.token_ids, tokens.data());
        host.tid2eid = rebind(p.tid2eid, table.data());
      } else {
        host.bias = rebind(p.bias, bias.data());
      }
      host.topk_ids = rebind(p.topk_ids, host_ids.data());
      host.topk_weights = rebind(p.topk_weights, host_weights.data());
      host.invalid_count = rebind(p.invalid_count, &host_counter);
      const dsv4::RouterReference reference = dsv4::compute_router_reference(host);
      const dsv4::RouterCheck check = dsv4::check_route_outputs(
          reference, ids.data(), K, weights.data(), K, fused ? workspace.data() : nullptr, E);
      m.check = check.ok ? "ok" : "FAIL";
      m.weight_error = check.max_weight_error;
      m.near_ties = check.near_tie_rows;
      if (!check.ok) std::fprintf(stderr, "\nverify: %s\n", check.first_failure.c_str());
    }

    m.time_us = device_.time_us([&](CudaStream stream) { dsv4::route(p, stream); }, timing_);
    m.gate_bytes = fused ? static_cast<double>(E * D * 2) : 0.0;
    // The floor counts the bytes the decode path is bound by: gate_weight (or, on the
    // logits path, the logits).
    m.bytes = fused ? m.gate_bytes : N * E * 4.0;
    return m;
  }

 private:
  BenchDevice& device_;
  TimingOptions timing_;
  bool verify_;
};

void print_router_usage() {
  std::printf(
      "hdk-bench router [options]\n"
      "  --preset flash,pro    gate shapes: flash (E=256, D=4096), pro (E=384, D=7168)\n"
      "  --N LIST              rows per call, e.g. 1,4,16,64,256 or 1-256 (powers of two)\n"
      "  --path LIST           fused (hidden + gate_weight, default), logits (given fp32\n"
      "                        logits), hash (tid2eid with the fused gate for the weights)\n"
      "  --hot                 keep caches warm between runs (default: flushed, cold)\n"
      "  --iterations N        timed runs per point (median)\n"
      "  --verify              check each point once against the float64 oracle\n"
      "  --json FILE           also write results as JSON\n"
      "  --cpu                 run on the CPU even when a GPU is present\n");
}

}  // namespace

int router_command(Options& options) {
  if (options.flag("help")) {
    print_router_usage();
    return 0;
  }
  std::unique_ptr<BenchDevice> device = BenchDevice::create(options.flag("cpu"));
  const bool gpu = device->device().is_cuda();
  const std::vector<std::string> presets = options.texts("preset", {"flash", "pro"});
  const std::vector<int64_t> rows = options.integers(
      "N", gpu ? std::vector<int64_t>{1, 4, 16, 64, 256} : std::vector<int64_t>{1, 4, 16, 64});
  const std::vector<std::string> paths = options.texts("path", {"fused"});
  const bool verify = options.flag("verify");
  TimingOptions timing;
  timing.flush_cache = !options.flag("hot");
  timing.iterations = static_cast<int>(options.integer("iterations", gpu ? 100 : 15));
  const std::string json_path = options.text("json", "");
  options.reject_unused();

  const RunBaseline baseline = start_run(*device, "router", timing);
  const double copy_gbs = baseline.copy_gbs;
  const double overhead_us = baseline.launch_overhead_us;

  ResultTable table({"preset", "E", "D", "N", "path", "time_us", "gate_GB/s", "%copy", "floor_us",
                     "x_floor", "err_w", "near_ties", "check"});
  RouterBench bench(*device, timing, verify);
  int failures = 0;
  for (const std::string& preset_name : presets) {
    const RouterPreset* preset = nullptr;
    for (const RouterPreset& candidate : kRouterPresets) {
      if (preset_name == candidate.name) preset = &candidate;
    }
    if (preset == nullptr) throw std::runtime_error("unknown preset '" + preset_name + "'");
    for (const std::string& path_name : paths) {
      const Path path = parse_path(path_name);
      for (int64_t N : rows) {
        report_progress(std::string(preset->name) + " N=" + std::to_string(N) + " " + path_name);
        Measurement m;
        try {
          m = bench.run(*preset, N, path);
        } catch (const std::exception& error) {
          std::fprintf(stderr, "\n%s N=%lld %s: %s\n", preset->name, static_cast<long long>(N),
                       path_name.c_str(), error.what());
          table.add_row({preset->name, std::to_string(preset->E), std::to_string(preset->D),
                         std::to_string(N), path_name, "error"});
          ++failures;
          continue;
        }
        // The floor: the fixed cost of one replay plus the bytes at copy bandwidth.
        const double floor_us = overhead_us + m.bytes / (copy_gbs * 1e9) * 1e6;
        const double gate_gbs = m.gate_bytes / (m.time_us * 1e-6) / 1e9;
        if (m.check == "FAIL") ++failures;
        table.add_row(
            {preset->name, std::to_string(preset->E), std::to_string(preset->D), std::to_string(N),
             path_name, format(m.time_us, 2), m.gate_bytes > 0 ? format(gate_gbs, 1) : "-",
             m.gate_bytes > 0 ? format(100.0 * gate_gbs / copy_gbs, 1) : "-", format(floor_us, 2),
             format(m.time_us / floor_us, 2), m.weight_error >= 0 ? format(m.weight_error, 7) : "-",
             m.check == "-" ? "-" : std::to_string(m.near_ties), m.check});
      }
    }
  }
  clear_progress();
  return finish_run(
      table,
      "gate_GB/s = gate_weight bytes (E x D bf16) / time; %copy = gate_GB/s / copy bandwidth;"
      "\nfloor_us = empty launch + gate_weight bytes (logits bytes on the logits path) / copy bw;"
      "\nx_floor = time / floor_us;"
      "\nerr_w = largest relative weight error against the float64 oracle; near_ties = rows whose"
      "\nselection differs from the oracle's only between keys within fp32 rounding",
      options, json_path, *device, baseline, timing, failures);
}

}  // namespace bench
}  // namespace hdk
