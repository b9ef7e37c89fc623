// hdk::topk's CUDA launch plan (src/topk/topk_launch_plan.h) on the CPU: the CTAs a row, threads
// and kernel instance for the shapes the benchmark times (bench/results/topk-h200), and what
// every plan over a grid of calls must hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>

#include "hdk/topk.h"
#include "topk/select_layout.h"
#include "topk/topk_launch_plan.h"

namespace hdk {
namespace {

using detail::plan_topk_launch;
using detail::TopkLaunchPlan;

constexpr int kSms = 132;                    // an H100 or H200
constexpr size_t kSharedLimit = 227 * 1024;  // opt-in shared memory a CTA on Hopper

TEST(TopkLaunchPlan, BenchmarkShapes) {
  // rows, length, k -> cluster, threads, cached keys a CTA
  const std::tuple<int64_t, int64_t, int64_t, int, int, int64_t> shapes[] = {
      {64, 65536, 512, 2, 1024, 32768},   {1, 262144, 2048, 8, 1024, 32768},
      {64, 262144, 1024, 8, 1024, 32768}, {16, 65536, 1024, 8, 512, 8192},
      {128, 8192, 512, 1, 512, 8192},     {64, 4096, 64, 1, 512, 4096},
      {1, 16384, 1024, 4, 512, 4096},     {32, 65536, 512, 4, 1024, 16384},
      {2, 1048576, 1024, 8, 1024, 0},     {300, 100, 8, 1, 128, 100},
      {9, 2000, 100, 1, 256, 2000}};
  for (const auto& [rows, length, k, cluster, threads, cached] : shapes) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(length) + " : " + std::to_string(k));
    const TopkLaunchPlan plan = plan_topk_launch(rows, length, k, kSms);
    EXPECT_EQ(plan.cluster_size, cluster);
    EXPECT_EQ(plan.threads, threads);
    EXPECT_EQ(plan.cached_keys, cached);
  }
}

TEST(TopkLaunchPlan, EveryPlanFitsAndCoversTheRow) {
  for (int64_t rows : {1, 2, 7, 16, 64, 65, 128, 1000}) {
    for (int64_t length : {1, 100, 1023, 4096, 8191, 16384, 65536, 262144, 300001, 1048576}) {
      for (int64_t k : {int64_t{1}, int64_t{8}, int64_t{512}, int64_t{1024}, kMaxTopK}) {
        SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(length) + " : " +
                     std::to_string(k));
        const TopkLaunchPlan plan = plan_topk_launch(rows, length, k, kSms);
        EXPECT_GE(plan.cluster_size, 1);
        EXPECT_LE(plan.cluster_size, detail::kTopkMaxCluster);
        const int64_t segment = (length + plan.cluster_size - 1) / plan.cluster_size;
        // The keys stay in shared memory exactly when the segment fits; a row that fits no
        // cluster rereads its values.
        EXPECT_EQ(plan.cached_keys, segment <= detail::kTopkCachedKeys ? segment : 0);
        if (length <= detail::kTopkMaxCluster * detail::kTopkCachedKeys) {
          EXPECT_GT(plan.cached_keys, 0);
        }
        // More CTAs than the keys need only while every row's cluster fits the SMs at once.
        const int64_t half = plan.cluster_size / 2;
        if (half >= 1 && (length + half - 1) / half <= detail::kTopkCachedKeys) {
          EXPECT_LE(rows * plan.cluster_size, kSms);
          EXPECT_GE(segment, 4096);
        }
        EXPECT_TRUE(plan.threads == 128 || plan.threads == 256 || plan.threads == 512 ||
                    plan.threads == 1024);
        EXPECT_EQ(plan.threads == detail::kTopkWideThreads, segment >= detail::kTopkWideSegment);
        // The sort holds every winner a row can have, in a power of two.
        EXPECT_GE(plan.sort_capacity, std::min(k, length));
        EXPECT_EQ(plan.sort_capacity & (plan.sort_capacity - 1), 0);
        EXPECT_LE(plan.sort_capacity, detail::kSelectCandidates);
        EXPECT_LE(plan.shared_bytes, kSharedLimit);
        EXPECT_EQ(plan.shared_bytes, detail::select_layout(plan.sort_capacity).bytes +
                                         static_cast<size_t>(plan.cached_keys) * 4);
      }
    }
  }
}

}  // namespace
}  // namespace hdk
