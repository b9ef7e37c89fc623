// Where hdk-bench runs: the first CUDA GPU when there is one, the CPU otherwise. Owns memory,
// measures the copy bandwidth every result is judged against, and times work.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "bench_cli.h"
#include "hdk/cuda_stream.h"
#include "hdk/device.h"

namespace hdk {
namespace bench {

struct TimingOptions {
  bool flush_cache = true;  // evict caches before each timed run (cold); false: hot
  int iterations = 50;
  int warmup = 5;
  // With flush_cache: also run a kernel of 192 KB of straight-line code on every SM first, so that
  // the timed kernels fetch their instructions from memory as they do after an engine's other
  // kernels. The L2 flush alone leaves each SM's instruction caches holding the code of the
  // previous replay, which runs on the same SMs.
  bool flush_code = false;
};

class BenchDevice {
 public:
  virtual ~BenchDevice() = default;

  // The CUDA device when present (unless force_cpu), else the CPU.
  static std::unique_ptr<BenchDevice> create(bool force_cpu);

  virtual Device device() const = 0;
  virtual std::string description() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* pointer) = 0;
  virtual void upload(void* device_pointer, const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* device_pointer, size_t bytes) = 0;

  // Read + write bytes per second of a large device-to-device copy (CPU: the best of several
  // copy methods and an in-place read-modify-write pass), in GB/s.
  virtual double copy_bandwidth_gbs() = 0;

  // What each copy method measured, when there are several (CPU); empty otherwise.
  virtual std::string copy_methods() const { return ""; }

  // Median microseconds of `work`. On CUDA, work is captured once into a CUDA graph and the
  // graph is replayed; each timed replay sits between two events. On the CPU, cold timing
  // copies buffers far larger than the caches before each run (see interleaved_copy_gbs).
  double time_us(const std::function<void(CudaStream)>& work, const TimingOptions& options) {
    return time_us(work, options, nullptr);
  }

  // Same, with `before_each` (when given) run before each run and its cache flush, outside the
  // timed span: it puts back state the work consumes (a compressor's window), so every run does
  // the same step.
  virtual double time_us(const std::function<void(CudaStream)>& work, const TimingOptions& options,
                         const std::function<void(CudaStream)>& before_each) = 0;

  // The copy bandwidth measured between the timed runs of the last time_us call (CPU, cold
  // timing: a copy precedes every timed run), in GB/s; 0 when it was not measured that way.
  virtual double interleaved_copy_gbs() const { return 0.0; }

  // Time of a graph replay of one empty kernel, timed like the calls (GPU), or of an empty call
  // (CPU): the fixed cost a tiny step cannot avoid, the "launch latency" of every floor.
  virtual double launch_overhead_us() = 0;
};

// Memory freed when it goes out of scope.
class DeviceAllocation {
 public:
  DeviceAllocation(BenchDevice& device, size_t bytes)
      : device_(&device), pointer_(bytes ? device.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceAllocation() {
    if (pointer_ != nullptr) device_->release(pointer_);
  }
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  void* get() const { return pointer_; }
  size_t size() const { return bytes_; }

 private:
  BenchDevice* device_;
  void* pointer_;
  size_t bytes_;
};

// What every result of a run is judged against, measured at the start of the run.
struct RunBaseline {
  double copy_gbs = 0.0;            // read + write bytes per second of a large copy, in GB/s
  double launch_overhead_us = 0.0;  // an empty-kernel graph replay (GPU) or call (CPU)
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// Measures the baseline and prints the run's header: device, copy bandwidth, empty-launch
// cost and how points are timed.
RunBaseline start_run(BenchDevice& device, const char* command, const TimingOptions& timing);

// Prints the table, the legend of its columns and a summary line (points, errors, checks passed
// and failed, seconds since start_run), writes the JSON when `json_path` is set (`json_fields`:
// extra fields as JSON text, e.g. the shapes run), and returns the process exit code: 1 when
// any point failed.
int finish_run(const ResultTable& table, const char* legend, const Options& options,
               const std::string& json_path, const BenchDevice& device, const RunBaseline& baseline,
               const TimingOptions& timing, int failures,
               const std::map<std::string, std::string>& json_fields = {});

}  // namespace bench
}  // namespace hdk
