// hdk-bench topk: hdk::topk over [N, L] fp32 rows (the indexer's selection): time per call
// (CUDA-graph replay, L2 flushed before each), values bytes / time as % of the copy bandwidth
// measured in the same run, x_floor, and an optional bit-exact check against a full sort.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "bench_device.h"
#include "hdk/error.h"
#include "hdk/topk.h"
#include "topk/reference/topk_reference.h"

namespace hdk {
namespace bench {
namespace {

struct TopkShape {
  int64_t N, L, k;
};

TopkShape parse_shape(const std::string& text) {
  TopkShape shape{};
  long long n = 0, l = 0, k = 0;
  if (std::sscanf(text.c_str(), "%lldx%lld:%lld", &n, &l, &k) != 3 || n < 0 || l < 0 || k < 0) {
    throw std::runtime_error("--shapes takes NxL:k items, e.g. 64x65536:512, got '" + text + "'");
  }
  shape.N = n, shape.L = l, shape.k = k;
  return shape;
}

struct Measurement {
  double time_us = 0, bytes = 0;
  std::string check = "-";
};

Measurement run_shape(BenchDevice& device, const TopkShape& shape, bool lengths,
                      const TimingOptions& timing, bool verify) {
  const int64_t N = shape.N, L = shape.L, k = shape.k;
  std::vector<float> values(static_cast<size_t>(N * L));
  uint64_t state = 0x243F6A8885A308D3ull ^ static_cast<uint64_t>(N * 31 + L);
  for (float& value : values) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    // Indexer-like scores: non-negative (ReLU-weighted sums), with repeats.
    value = static_cast<float>((state >> 40) % 100000) * 1e-3f;
  }
  std::vector<int32_t> row_lengths(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n)
    row_lengths[n] = static_cast<int32_t>(L - (n * 977) % std::max<int64_t>(L / 2, 1));

  DeviceAllocation d_values(device, values.size() * 4), d_lengths(device, row_lengths.size() * 4),
      d_out_values(device, N * k * 4), d_out_indices(device, N * k * 4);
  device.upload(d_values.get(), values.data(), values.size() * 4);
  device.upload(d_lengths.get(), row_lengths.data(), row_lengths.size() * 4);
  const Device where = device.device();
  const TensorView v = TensorView::contiguous(d_values.get(), DType::kFloat32, {N, L}, where);
  const TensorView ov = TensorView::contiguous(d_out_values.get(), DType::kFloat32, {N, k}, where);
  const TensorView oi = TensorView::contiguous(d_out_indices.get(), DType::kInt32, {N, k}, where);
  const TensorView rl =
      lengths ? TensorView::contiguous(d_lengths.get(), DType::kInt32, {N}, where) : TensorView();

  Measurement m;
  if (verify) {
    topk(v, k, ov, oi, rl);
    std::vector<float> got_values(N * k), want_values(N * k);
    std::vector<int32_t> got_indices(N * k), want_indices(N * k);
    device.download(got_values.data(), d_out_values.get(), got_values.size() * 4);
    device.download(got_indices.data(), d_out_indices.get(), got_indices.size() * 4);
    topk_reference(
        TensorView::contiguous(values.data(), DType::kFloat32, {N, L}), k,
        TensorView::contiguous(want_values.data(), DType::kFloat32, {N, k}),
        TensorView::contiguous(want_indices.data(), DType::kInt32, {N, k}),
        lengths ? TensorView::contiguous(row_lengths.data(), DType::kInt32, {N}) : TensorView());
    const bool same =
        got_indices == want_indices &&
        std::memcmp(got_values.data(), want_values.data(), got_values.size() * 4) == 0;
    m.check = same ? "ok" : "FAIL";
  }
  m.time_us = device.time_us([&](CudaStream stream) { topk(v, k, ov, oi, rl, stream); }, timing);
  int64_t valid = 0;
  for (int64_t n = 0; n < N; ++n)
    valid += lengths ? std::min<int64_t>(row_lengths[n], L) : L;
  m.bytes = static_cast<double>(valid) * 4.0 + static_cast<double>(N * k) * 8.0;
  return m;
}

void print_topk_usage() {
  std::printf(
      "hdk-bench topk [options]\n"
      "  --shapes LIST         NxL:k items (default 64x65536:512,1x262144:2048,\n"
      "                        64x262144:1024,16x65536:1024,128x8192:512,64x4096:64)\n"
      "  --lengths             pass row lengths (rows between L/2 and L long)\n"
      "  --hot                 keep caches warm between runs (default: flushed, cold)\n"
      "  --iterations N        timed runs per point (median)\n"
      "  --verify              check each point once against a full sort (bit-exact)\n"
      "  --json FILE           also write results as JSON\n"
      "  --cpu                 run on the CPU even when a GPU is present\n");
}

}  // namespace

int topk_command(Options& options) {
  if (options.flag("help")) {
    print_topk_usage();
    return 0;
  }
  std::unique_ptr<BenchDevice> device = BenchDevice::create(options.flag("cpu"));
  const bool gpu = device->device().is_cuda();
  const std::vector<std::string> shape_texts =
      options.texts("shapes", {"64x65536:512", "1x262144:2048", "64x262144:1024", "16x65536:1024",
                               "128x8192:512", "64x4096:64"});
  const bool lengths = options.flag("lengths");
  const bool verify = options.flag("verify");
  TimingOptions timing;
  timing.flush_cache = !options.flag("hot");
  timing.iterations = static_cast<int>(options.integer("iterations", gpu ? 50 : 5));
  const std::string json_path = options.text("json", "");
  options.reject_unused();

  const RunBaseline baseline = start_run(*device, "topk", timing);
  const double copy_gbs = baseline.copy_gbs;
  const double overhead_us = baseline.launch_overhead_us;

  ResultTable table({"N", "L", "k", "lengths", "time_us", "GB/s", "%copy", "x_floor", "check"});
  int failures = 0;
  for (const std::string& text : shape_texts) {
    const TopkShape shape = parse_shape(text);
    report_progress(text);
    Measurement m;
    try {
      m = run_shape(*device, shape, lengths, timing, verify);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "\n%s: %s\n", text.c_str(), error.what());
      table.add_row({std::to_string(shape.N), std::to_string(shape.L), std::to_string(shape.k),
                     lengths ? "yes" : "no", "error"});
      ++failures;
      continue;
    }
    if (m.check == "FAIL") ++failures;
    const double gbs = m.bytes / (m.time_us * 1e-6) / 1e9;
    const double floor_us = overhead_us + m.bytes / (copy_gbs * 1e9) * 1e6;
    table.add_row({std::to_string(shape.N), std::to_string(shape.L), std::to_string(shape.k),
                   lengths ? "yes" : "no", format(m.time_us, 2), format(gbs, 1),
                   format(100.0 * gbs / copy_gbs, 1), format(m.time_us / floor_us, 2), m.check});
  }
  clear_progress();
  return finish_run(
      table,
      "GB/s = (valid values read + outputs written) / time; %copy = GB/s / copy bandwidth;"
      "\nx_floor = time / (empty launch + bytes / copy bw)",
      options, json_path, *device, baseline, timing, failures);
}

}  // namespace bench
}  // namespace hdk
