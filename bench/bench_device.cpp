#include "bench_device.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_cli.h"
#include "core/thread_pool.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "code_flush.h"
#include "floor_kernels.h"
#endif

namespace hdk {
namespace bench {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// Copies `bytes` with non-temporal stores: the written lines go straight to memory instead of
// being read into the cache first (write-allocate), as a streaming kernel's output would.
void copy_streaming(char* target, const char* source, size_t bytes) {
#if defined(__SSE2__)
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_load_si128(reinterpret_cast<const __m128i*>(source + i));
    const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(source + i + 16));
    const __m128i c = _mm_load_si128(reinterpret_cast<const __m128i*>(source + i + 32));
    const __m128i d = _mm_load_si128(reinterpret_cast<const __m128i*>(source + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(target + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(target + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(target + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(target + i + 48), d);
  }
  _mm_sfence();
  std::memcpy(target + i, source + i, bytes - i);
#else
  std::memcpy(target, source, bytes);
#endif
}

// Adds one to every 64-bit word in place: the memory traffic of a decode step's state update
// (each line read once and written back), with no second buffer.
void read_modify_write(char* data, size_t bytes) {
  auto* words = reinterpret_cast<uint64_t*>(data);
  const size_t count = bytes / sizeof(uint64_t);
  for (size_t i = 0; i < count; ++i)
    words[i] += 1;
}

// The bandwidth hdk's CPU results are judged against: the best of several ways to read and
// write a buffer far larger than the last-level cache, so that no one method's weakness lowers
// the bar. (The pool copying 1 MiB chunks alone read 21.8 GB/s where two threads each copying
// half read 62-67 GB/s: glibc's memcpy uses non-temporal stores only for large calls.) The
// in-place read-modify-write is what a decode step does to its state; a copy to a second buffer
// can be slower than that (another buffer's pages, write-allocate reads), which put CPU points
// at 108-118% of a copies-only bandwidth.
class CopyMeter {
 public:
  static constexpr int kMethods = 5;

  CopyMeter(BenchDevice& device, size_t bytes)
      : source_(device, bytes), target_(device, bytes), bytes_(bytes) {
    std::memset(source_.get(), 1, bytes);
    std::memset(target_.get(), 2, bytes);
  }

  // One copy by each method, each one's GB/s added to that method's samples.
  void sample() {
    for (int method = 0; method < kMethods; ++method)
      sample(method);
  }

  // One copy by one method (it moves far more than the caches hold, so it also evicts them).
  void sample(int method) {
    char* target = static_cast<char*>(target_.get());
    const char* source = static_cast<const char*>(source_.get());
    const int threads = detail::num_threads();
    {
      const auto start = std::chrono::steady_clock::now();
      switch (method) {
        case 0: {  // the thread pool the backend runs on, 1 MiB chunks
          const int64_t chunks = static_cast<int64_t>(bytes_ >> 20);
          detail::parallel_for(chunks, [&](int64_t begin, int64_t end) {
            std::memcpy(target + (begin << 20), source + (begin << 20),
                        static_cast<size_t>(end - begin) << 20);
          });
          break;
        }
        case 1:
          on_threads(threads, [&](size_t offset, size_t size) {
            std::memcpy(target + offset, source + offset, size);
          });
          break;
        case 2:
          std::memcpy(target, source, bytes_);
          break;
        case 3:
          on_threads(threads, [&](size_t offset, size_t size) {
            copy_streaming(target + offset, source + offset, size);
          });
          break;
        case 4:
          on_threads(threads,
                     [&](size_t offset, size_t size) { read_modify_write(target + offset, size); });
          break;
      }
      samples_[method].push_back(2.0 * static_cast<double>(bytes_) / seconds_since(start) / 1e9);
    }
  }

  void clear() {
    for (std::vector<double>& samples : samples_)
      samples.clear();
  }

  bool empty() const { return samples_[0].empty(); }

  // The best method's median.
  double best_gbs() const {
    double best = 0.0;
    for (const std::vector<double>& samples : samples_)
      best = std::max(best, median(samples));
    return best;
  }

  std::string describe() const {
    static const char* const kNames[kMethods] = {"pool memcpy", "threads memcpy",
                                                 "one thread memcpy", "threads streaming stores",
                                                 "threads in-place read-modify-write"};
    std::string text;
    for (int method = 0; method < kMethods; ++method) {
      text += (method ? ", " : "") + std::string(kNames[method]) + " " +
              format(median(samples_[method]), 1);
    }
    return text;
  }

 private:
  // Plain threads, each on one contiguous 64-byte-aligned share.
  void on_threads(int threads, const std::function<void(size_t, size_t)>& copy) {
    std::vector<std::thread> workers;
    const size_t share = (bytes_ / static_cast<size_t>(threads) + 63) / 64 * 64;
    for (int t = 0; t < threads; ++t) {
      const size_t offset = std::min(bytes_, share * static_cast<size_t>(t));
      const size_t size = std::min(share, bytes_ - offset);
      workers.emplace_back([&copy, offset, size] { copy(offset, size); });
    }
    for (std::thread& worker : workers)
      worker.join();
  }

  DeviceAllocation source_, target_;
  size_t bytes_;
  std::vector<double> samples_[kMethods];
};

class CpuDevice : public BenchDevice {
 public:
  Device device() const override { return Device::cpu(); }

  std::string description() const override {
    return "CPU: " + cpu_model() + ", " + std::to_string(detail::num_threads()) + " threads";
  }

  void* allocate(size_t bytes) override {
    void* pointer = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (pointer == nullptr) throw std::runtime_error("out of host memory");
    return pointer;
  }
  void release(void* pointer) override { std::free(pointer); }
  void upload(void* device_pointer, const void* host, size_t bytes) override {
    std::memcpy(device_pointer, host, bytes);
  }
  void download(void* host, const void* device_pointer, size_t bytes) override {
    std::memcpy(host, device_pointer, bytes);
  }

  double copy_bandwidth_gbs() override {
    CopyMeter& meter = copy_meter();
    meter.clear();
    for (int run = 0; run < 7; ++run)
      meter.sample();
    return meter.best_gbs();
  }

  std::string copy_methods() const override {
    return copy_meter_ && !copy_meter_->empty() ? copy_meter_->describe() : "";
  }

  // Cold timing measures the copy bandwidth before every timed call: the copy evicts the caches
  // (it moves far more than they hold), and the baseline sees the same machine state, other
  // processes included, as the calls it is compared with. One method a call, taken in turn:
  // all five before each call made the flushes 5x the work (9 of the main job's 14 s) for the
  // same eviction.
  using BenchDevice::time_us;
  double time_us(const std::function<void(CudaStream)>& work, const TimingOptions& options,
                 const std::function<void(CudaStream)>& before_each) override {
    for (int i = 0; i < options.warmup; ++i)
      work(nullptr);
    if (options.flush_cache) copy_meter().clear();
    std::vector<double> samples;
    for (int i = 0; i < options.iterations; ++i) {
      if (before_each) before_each(nullptr);
      if (options.flush_cache) copy_meter().sample(i % CopyMeter::kMethods);
      const auto start = std::chrono::steady_clock::now();
      work(nullptr);
      samples.push_back(seconds_since(start) * 1e6);
    }
    interleaved_copy_gbs_ = options.flush_cache ? copy_meter().best_gbs() : 0.0;
    return median(samples);
  }

  double interleaved_copy_gbs() const override { return interleaved_copy_gbs_; }

  double launch_overhead_us() override {
    return time_us([](CudaStream) {}, TimingOptions{false, 101, 5});
  }

 private:
  CopyMeter& copy_meter() {
    if (!copy_meter_) copy_meter_ = std::make_unique<CopyMeter>(*this, size_t{256} << 20);
    return *copy_meter_;
  }

  std::unique_ptr<CopyMeter> copy_meter_;
  double interleaved_copy_gbs_ = 0.0;
};

#ifdef HDK_WITH_CUDA
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

class CudaDevice : public BenchDevice {
 public:
  CudaDevice() {
    check(cudaGetDeviceProperties(&properties_, 0), "cudaGetDeviceProperties");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    // Twice the L2 so a memset evicts every line the step could reuse.
    flush_bytes_ = std::max<size_t>(size_t{2} * properties_.l2CacheSize, size_t{128} << 20);
    check(cudaMalloc(&flush_buffer_, flush_bytes_), "cudaMalloc (L2 flush buffer)");
  }

  ~CudaDevice() override {
    cudaFree(flush_buffer_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::cuda(0); }

  std::string description() const override {
    int driver = 0;
    cudaDriverGetVersion(&driver);
    return std::string(properties_.name) + " (" + std::to_string(properties_.multiProcessorCount) +
           " SMs, " + std::to_string(properties_.l2CacheSize >> 20) + " MiB L2, " +
           std::to_string(properties_.totalGlobalMem >> 30) + " GiB, driver CUDA " +
           std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) + ")";
  }

  void* allocate(size_t bytes) override {
    void* pointer = nullptr;
    check(cudaMalloc(&pointer, bytes), "cudaMalloc");
    return pointer;
  }
  void release(void* pointer) override { cudaFree(pointer); }
  void upload(void* device_pointer, const void* host, size_t bytes) override {
    check(cudaMemcpy(device_pointer, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void download(void* host, const void* device_pointer, size_t bytes) override {
    check(cudaMemcpy(host, device_pointer, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }

  double copy_bandwidth_gbs() override {
    const size_t bytes = size_t{1} << 30;
    DeviceAllocation source(*this, bytes), target(*this, bytes);
    check(cudaMemset(source.get(), 1, bytes), "cudaMemset");
    std::vector<double> samples;
    for (int run = 0; run < 12; ++run) {
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      check(cudaMemcpyAsync(target.get(), source.get(), bytes, cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync D2D");
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      if (run >= 2) samples.push_back(2.0 * bytes / (ms * 1e-3) / 1e9);
    }
    return median(samples);
  }

  using BenchDevice::time_us;
  double time_us(const std::function<void(CudaStream)>& work, const TimingOptions& options,
                 const std::function<void(CudaStream)>& before_each) override {
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    try {
      work(stream_);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "end capture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    std::vector<double> samples;
    for (int i = 0; i < options.warmup + options.iterations; ++i) {
      if (before_each) before_each(stream_);
      if (options.flush_cache) {
        if (options.flush_code) launch_code_flush(stream_);
        check(cudaMemsetAsync(flush_buffer_, i & 0xff, flush_bytes_, stream_), "L2 flush");
      }
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      if (i >= options.warmup) samples.push_back(ms * 1e3);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return median(samples);
  }

  double launch_overhead_us() override {
    // A graph holding one empty kernel, timed exactly like the calls it is compared with (after
    // an L2 flush, so the host has queued the replay before the GPU reaches it): the GPU-side
    // cost of launching a kernel, the "launch latency" of every floor. (Until 2026-11-22 this was
    // a 1-byte memset node timed without the flush: 2.4-3.6 us and once 8.5 us, because the
    // GPU then also waited for the host to submit the replay.) The smallest of three medians:
    // a single one read 10 us once, on a GPU that had just left its idle clocks.
    double best = 0.0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const double median_us = time_us([](CudaStream stream) { launch_empty_kernel(stream); },
                                       TimingOptions{true, 101, 20});
      best = attempt == 0 ? median_us : std::min(best, median_us);
    }
    return best;
  }

 private:
  cudaDeviceProp properties_{};
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  void* flush_buffer_ = nullptr;
  size_t flush_bytes_ = 0;
};
#endif

}  // namespace

std::unique_ptr<BenchDevice> BenchDevice::create(bool force_cpu) {
#ifdef HDK_WITH_CUDA
  int count = 0;
  if (!force_cpu && cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    return std::make_unique<CudaDevice>();
  }
  cudaGetLastError();
#endif
  (void)force_cpu;
  return std::make_unique<CpuDevice>();
}

RunBaseline start_run(BenchDevice& device, const char* command, const TimingOptions& timing) {
  const bool gpu = device.device().is_cuda();
  std::printf("hdk-bench %s on %s\n", command, device.description().c_str());
  RunBaseline baseline;
  baseline.copy_gbs = device.copy_bandwidth_gbs();
  baseline.launch_overhead_us = device.launch_overhead_us();
  std::printf("copy bandwidth (read + write, measured now%s): %.1f GB/s; %s: %.2f us\n",
              gpu ? "" : ", best of the methods below", baseline.copy_gbs,
              gpu ? "empty kernel (graph replay, timed like the calls)" : "empty call",
              baseline.launch_overhead_us);
  const std::string methods = device.copy_methods();
  if (!methods.empty())
    std::printf("copy bandwidth by method (GB/s, medians): %s\n", methods.c_str());
  std::printf("timing: %s, median of %d runs%s\n\n", gpu ? "CUDA graph replay" : "wall clock",
              timing.iterations,
              !timing.flush_cache        ? ", hot"
              : gpu && timing.flush_code ? ", caches flushed before each (instruction caches too)"
                                         : ", caches flushed before each");
  return baseline;
}

int finish_run(const ResultTable& table, const char* legend, const Options& options,
               const std::string& json_path, const BenchDevice& device, const RunBaseline& baseline,
               const TimingOptions& timing, int failures,
               const std::map<std::string, std::string>& json_fields) {
  clear_progress();
  table.print();
  std::printf("\n%s\n", legend);
  if (!json_path.empty()) {
    write_json(json_path, options.command_line(),
               {{"device", device.description()},
                {"copy_bandwidth_gbs", format(baseline.copy_gbs, 2)},
                {"launch_overhead_us", format(baseline.launch_overhead_us, 3)},
                {"timing", !timing.flush_cache ? "hot"
                           : device.device().is_cuda() && timing.flush_code
                               ? "cold (flushed, instruction caches too)"
                               : "cold (flushed)"}},
               table.json_records(), json_fields);
  }
  const size_t passed = table.count("check", "ok");
  const size_t failed = table.count("check", "FAIL");
  std::printf(
      "summary: %zu points, %zu stopped by an error, %zu checked (%zu passed, %zu failed);"
      " %.1f s\n",
      table.rows(), table.count("time_us", "error"), passed + failed, passed, failed,
      seconds_since(baseline.started));
  if (failures > 0) {
    std::printf("%d point(s) failed\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace bench
}  // namespace hdk
