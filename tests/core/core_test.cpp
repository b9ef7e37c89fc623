// TensorView, dtype names, float conversions, the fast divider and the thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/fast_divide.h"
#include "core/float_convert.h"
#include "core/thread_pool.h"
#include "hdk/hdk.h"

namespace hdk {
namespace {

TEST(TensorView, ContiguousStridesAndQueries) {
  float data[24];
  const TensorView view = TensorView::contiguous(data, DType::kFloat32, {2, 3, 4});
  EXPECT_TRUE(view.defined());
  EXPECT_EQ(view.ndim, 3);
  EXPECT_EQ(view.numel(), 24);
  EXPECT_EQ(view.stride(0), 12);
  EXPECT_EQ(view.stride(1), 4);
  EXPECT_EQ(view.stride(2), 1);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_EQ(view.shape_str(), "[2, 3, 4]");
  EXPECT_TRUE(view.device.is_cpu());
  EXPECT_FALSE(TensorView().defined());
  EXPECT_EQ(TensorView().shape_str(), "(not given)");
}

TEST(TensorView, StridedAndDevice) {
  float data[64];
  const TensorView view =
      TensorView::strided(data, DType::kBFloat16, {4, 2}, {16, 1}, Device::cuda(1));
  EXPECT_FALSE(view.is_contiguous());
  EXPECT_EQ(view.device.str(), "cuda:1");
  EXPECT_EQ(view.element_size(), 2u);
  const TensorView scalar = TensorView::contiguous(data, DType::kInt64, std::vector<int64_t>{});
  EXPECT_EQ(scalar.ndim, 0);
  EXPECT_EQ(scalar.numel(), 1);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kInt32), 4u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(dtype_size(DType::kUInt8), 1u);
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_STREQ(version(), "0.1.0");
}

TEST(FloatConvert, BFloat16RoundsToNearestEven) {
  using detail::bf16_to_float;
  using detail::float_to_bf16;
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up to even.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max()))));
}

TEST(FloatConvert, HalfRoundTripAndEdges) {
  using detail::float_to_half;
  using detail::half_to_float;
  for (float value : {0.0f, -0.0f, 1.0f, -1.5f, 65504.0f, 6.103515625e-05f, 5.9604644775390625e-08f,
                      0.333251953125f}) {
    EXPECT_EQ(half_to_float(float_to_half(value)), value) << value;
  }
  EXPECT_EQ(float_to_half(70000.0f), 0x7c00);                               // overflow to inf
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);           // tie to even
  EXPECT_EQ(float_to_half(2.0f * 5.9604644775390625e-08f * 1.5f), 0x0003);  // subnormal 3 * 2^-24
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  // Every finite half survives a round trip through float.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00) continue;
    EXPECT_EQ(float_to_half(half_to_float(h)), h) << bits;
  }
}

TEST(ThreadPool, CoversTheRangeOnce) {
  for (int64_t count : {1, 2, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(count);
    detail::parallel_for(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        hits[i]++;
    });
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(hits[i].load(), 1) << count << " " << i;
  }
  detail::parallel_for(0, [](int64_t, int64_t) { FAIL() << "no chunk for an empty range"; });
}

TEST(ThreadPool, NestedCallsAndExceptions) {
  std::atomic<int64_t> total{0};
  detail::parallel_for(8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      detail::parallel_for(10, [&](int64_t b, int64_t e) { total += e - b; });
    }
  });
  EXPECT_EQ(total.load(), 80);
  EXPECT_THROW(detail::parallel_for(100,
                                    [](int64_t begin, int64_t) {
                                      if (begin == 0) throw std::runtime_error("chunk failed");
                                    }),
               std::runtime_error);
  // The pool still works after an exception.
  std::atomic<int64_t> after{0};
  detail::parallel_for(50, [&](int64_t begin, int64_t end) { after += end - begin; });
  EXPECT_EQ(after.load(), 50);
}

TEST(FastDivide, EqualsIntegerDivisionRoundedDownAndUp) {
  // Divisors: small ones, powers of two and their neighbours, block sizes, the largest; the
  // numerators around multiples of the divisor and at the ends of the range (below 2^31).
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 300; ++d)
    divisors.push_back(d);
  for (int bit = 9; bit < 31; ++bit) {
    for (int64_t delta : {-1, 0, 1})
      divisors.push_back(static_cast<uint32_t>((int64_t{1} << bit) + delta));
  }
  divisors.push_back(1000003u);
  divisors.push_back(0x7fffffffu);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&]() {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (uint32_t d : divisors) {
    const detail::FastDivide divide(d);
    std::vector<uint32_t> numerators = {0u, 1u, d - 1, d, d + 1, 0x7fffffffu, 0x7ffffffeu};
    for (int i = 0; i < 2000; ++i) {
      const uint32_t n = static_cast<uint32_t>(next() % 0x80000000ull);
      numerators.push_back(n);
      const uint32_t multiple = n / d * d;
      numerators.push_back(multiple);
      if (multiple > 0) numerators.push_back(multiple - 1);
    }
    for (uint32_t n : numerators) {
      if (n > 0x7fffffffu) continue;
      ASSERT_EQ(divide.quotient(n), n / d) << n << " / " << d;
      ASSERT_EQ(divide.ceil_quotient(n), n / d + (n % d != 0 ? 1u : 0u)) << n << " / " << d;
    }
  }
}

}  // namespace
}  // namespace hdk
