// A persistent pool of worker threads for the CPU backends: created once, reused by every call,
// so a decode step pays no thread start-up.
#pragma once

#include <cstdint>
#include <functional>

namespace hdk {
namespace detail {

// Calls body(begin, end) over disjoint chunks covering [0, count), on the pool's workers and the
// calling thread. Blocks until all chunks ran. Nested or concurrent calls run serially on the
// caller. The first exception a chunk throws is rethrown here.
void parallel_for(int64_t count, const std::function<void(int64_t, int64_t)>& body);

// Threads parallel_for uses (workers + caller): HDK_NUM_THREADS if set, else the hardware's.
int num_threads();

}  // namespace detail
}  // namespace hdk
