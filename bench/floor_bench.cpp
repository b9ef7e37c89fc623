// hdk-bench floor: the in-place read-modify-write floor of this GPU over the bytes of a GDN
// state pool (flat, per-warp blocks, per-warp blocks behind an index), next to the copy
// bandwidth. It answers "how close to the hardware is a decode step" without any decode math.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "bench_device.h"

#ifdef HDK_WITH_CUDA
#include "floor_kernels.h"
#endif

namespace hdk {
namespace bench {

namespace {

void print_floor_usage() {
  std::printf(
      "hdk-bench floor [options]   (needs a GPU and a CUDA build)\n"
      "  --mib LIST       buffer sizes in MiB, e.g. 2,8,32 or 2-1024 (powers of two;\n"
      "                   default 2,8,32,128,512,1024)\n"
      "  --hot            keep the L2 warm between runs (default: flushed, cold)\n"
      "  --iterations N   timed runs per point (median; default 30)\n"
      "  --json FILE      also write results as JSON\n");
}

}  // namespace

int floor_command(Options& options) {
  if (options.flag("help")) {
    print_floor_usage();
    return 0;
  }
  const std::vector<int64_t> megabytes = options.integers("mib", {2, 8, 32, 128, 512, 1024});
  TimingOptions timing;
  timing.flush_cache = !options.flag("hot");
  timing.iterations = static_cast<int>(options.integer("iterations", 30));
  const std::string json_path = options.text("json", "");
  options.reject_unused();
#ifndef HDK_WITH_CUDA
  (void)megabytes;
  throw std::runtime_error("hdk-bench floor measures GPU memory patterns; this build has no CUDA");
#else
  std::unique_ptr<BenchDevice> device = BenchDevice::create(false);
  if (!device->device().is_cuda()) throw std::runtime_error("hdk-bench floor needs a GPU");
  std::printf("hdk-bench floor on %s\n", device->description().c_str());
  const double copy_gbs = device->copy_bandwidth_gbs();
  const double overhead_us = device->launch_overhead_us();
  std::printf("copy bandwidth (read + write): %.1f GB/s; empty kernel graph replay: %.2f us\n\n",
              copy_gbs, overhead_us);
  ResultTable table({"MiB", "pattern", "time_us", "GB/s", "%copy"});
  for (int64_t mib : megabytes) {
    const int64_t bytes = mib << 20;
    DeviceAllocation data(*device, bytes);
    std::vector<uint8_t> fill(static_cast<size_t>(std::min<int64_t>(bytes, 16 << 20)));
    for (size_t i = 0; i < fill.size(); ++i)
      fill[i] = static_cast<uint8_t>(i * 131 + 7);
    for (int64_t offset = 0; offset < bytes; offset += static_cast<int64_t>(fill.size())) {
      device->upload(static_cast<char*>(data.get()) + offset, fill.data(),
                     std::min<int64_t>(static_cast<int64_t>(fill.size()), bytes - offset));
    }
    std::vector<int32_t> order(static_cast<size_t>(bytes / 4096));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(5));
    DeviceAllocation blocks(*device, order.size() * sizeof(int32_t));
    device->upload(blocks.get(), order.data(), order.size() * sizeof(int32_t));
    const struct {
      FloorPattern pattern;
      const char* name;
    } patterns[] = {{FloorPattern::kFlat, "flat"},
                    {FloorPattern::kBlocks, "warp-4KiB"},
                    {FloorPattern::kIndexedBlocks, "warp-4KiB-indexed"}};
    for (const auto& pattern : patterns) {
      const double us = device->time_us(
          [&](CudaStream stream) {
            launch_floor(pattern.pattern, data.get(), bytes,
                         static_cast<const int32_t*>(blocks.get()),
                         static_cast<cudaStream_t>(stream));
          },
          timing);
      const double gbs = 2.0 * bytes / (us * 1e-6) / 1e9;
      table.add_row({std::to_string(mib), pattern.name, format(us, 2), format(gbs, 1),
                     format(100.0 * gbs / copy_gbs, 1)});
    }
  }
  table.print();
  if (!json_path.empty()) {
    write_json(json_path, options.command_line(),
               {{"device", device->description()}, {"copy_bandwidth_gbs", format(copy_gbs, 2)}},
               table.json_records());
  }
  return 0;
#endif
}

}  // namespace bench
}  // namespace hdk
