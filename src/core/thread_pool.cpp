#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace hdk {
namespace detail {
namespace {

thread_local bool inside_parallel_region = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i)
      workers_.emplace_back([this] { work(); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& worker : workers_)
      worker.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Returns false when another call holds the pool; the caller then runs serially.
  bool run(int64_t count, const std::function<void(int64_t, int64_t)>& body) {
    std::unique_lock<std::mutex> call(call_mutex_, std::try_to_lock);
    if (!call.owns_lock()) return false;
    // Several chunks per thread so an uneven chunk does not leave threads idle.
    const int64_t chunks = std::min<int64_t>(count, static_cast<int64_t>(size()) * 4);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = &body;
      count_ = count;
      chunks_ = chunks;
      next_chunk_.store(0);
      pending_workers_ = static_cast<int>(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    run_chunks();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_workers_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void run_chunks() {
    inside_parallel_region = true;
    for (;;) {
      const int64_t chunk = next_chunk_.fetch_add(1);
      if (chunk >= chunks_) break;
      const int64_t begin = count_ * chunk / chunks_;
      const int64_t end = count_ * (chunk + 1) / chunks_;
      try {
        (*body_)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    inside_parallel_region = false;
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      run_chunks();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_workers_;
      }
      done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  int pending_workers_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

int configured_threads() {
  if (const char* text = std::getenv("HDK_NUM_THREADS")) {
    const int requested = std::atoi(text);
    if (requested >= 1) return requested;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool instance(configured_threads());
  return instance;
}

}  // namespace

int num_threads() {
  return pool().size();
}

void parallel_for(int64_t count, const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  if (count == 1 || inside_parallel_region || num_threads() == 1 || !pool().run(count, body)) {
    body(0, count);
  }
}

}  // namespace detail
}  // namespace hdk
