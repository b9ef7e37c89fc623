// Each bad argument of the KV cache operations is an hdk::Error naming it, before any work; the
// block allocator's rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "hdk/dsv4/block_allocator.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "support/expect_error.h"

namespace hdk {
namespace testing {
namespace {

struct StoreBuffers {
  std::vector<float> values = std::vector<float>(4 * 512, 0.5f);
  std::vector<int32_t> slots = {0, 1, 2, 3};
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 64 * 584, 0);
  dsv4::StoreEntriesParams params() {
    dsv4::StoreEntriesParams p;
    p.values = TensorView::contiguous(values.data(), DType::kFloat32, {4, 512});
    p.slots = TensorView::contiguous(slots.data(), DType::kInt32, {4});
    p.cache = TensorView::contiguous(cache.data(), DType::kUInt8, {2, 64 * 584});
    p.block_size = 64;
    return p;
  }
};

TEST(KvValidation, StoreEntriesNamesTheArgument) {
  StoreBuffers b;
  expect_error(
      [&] {
        auto p = b.params();
        p.values = TensorView::contiguous(b.values.data(), DType::kFloat32, {4, 448});
        dsv4::store_entries(p);
      },
      "argument 'values' must have shape [N, 512] = [4, 512], got [4, 448]");
  expect_error(
      [&] {
        auto p = b.params();
        p.cache = TensorView::contiguous(b.cache.data(), DType::kUInt8, {2, 64 * 576});
        dsv4::store_entries(p);
      },
      "argument 'cache' must have block_size * 584 = 37376 bytes per page");
  expect_error(
      [&] {
        auto p = b.params();
        p.block_size = 32;
        dsv4::store_entries(p);
      },
      "block_size * 584 = 18688");
  expect_error(
      [&] {
        auto p = b.params();
        p.block_size = 0;
        dsv4::store_entries(p);
      },
      "option 'block_size' must be at least 1, got 0");
  expect_error(
      [&] {
        auto p = b.params();
        p.values.dtype = DType::kInt32;
        dsv4::store_entries(p);
      },
      "argument 'values' must have dtype float32 or bfloat16, got int32");
  expect_error(
      [&] {
        auto p = b.params();
        p.slots.dtype = DType::kFloat32;
        dsv4::store_entries(p);
      },
      "argument 'slots' must have dtype int32 or int64, got float32");
  expect_error(
      [&] {
        auto p = b.params();
        p.slots = TensorView::contiguous(b.slots.data(), DType::kInt32, {3});
        dsv4::store_entries(p);
      },
      "argument 'slots' must have shape [N] = [4], got [3]");
  expect_error(
      [&] {
        auto p = b.params();
        p.cache.dtype = DType::kInt32;
        dsv4::store_entries(p);
      },
      "argument 'cache' must have dtype uint8");
  expect_error(
      [&] {
        auto p = b.params();
        p.cache = TensorView::contiguous(b.values.data(), DType::kUInt8, {1, 64 * 584 / 8});
        p.block_size = 8;
        dsv4::store_entries(p);
      },
      "argument 'cache' overlaps 'values'");
  expect_error(
      [&] {
        auto p = b.params();
        p.slots = TensorView();
        dsv4::store_entries(p);
      },
      "argument 'slots' is required");
  expect_error(
      [&] {
        auto p = b.params();
        p.values.device = Device::cuda(0);
        dsv4::store_entries(p);
      },
      "argument 'values' is on cuda:0 but slots, cache are on cpu");
  expect_error(
      [&] {
        auto p = b.params();  // two blocks on one page: rows of one block overwrite the other's
        p.cache.strides[0] = 0;
        dsv4::store_entries(p);
      },
      "argument 'cache' has stride 0 in dim 0 (extent 2");
}

// Two rows writing one slot race on CUDA; the CPU (always) and check_indices refuse them before
// anything is written. Reads may repeat a slot.
TEST(KvValidation, WrittenSlotsAreDistinct) {
  for (bool check_indices : {false, true}) {
    StoreBuffers b;
    b.slots = {0, 70, 2, 70};
    auto p = b.params();
    p.check_indices = check_indices;
    expect_error([&] { dsv4::store_entries(p); },
                 "slots[3] = 70 repeats slots[1]: the slots one call writes must be distinct");
    EXPECT_TRUE(std::all_of(b.cache.begin(), b.cache.end(), [](uint8_t x) { return x == 0; }));
  }
  {
    StoreBuffers b;  // padding rows may repeat
    b.slots = {-1, 3, -1, 4};
    EXPECT_NO_THROW(dsv4::store_entries(b.params()));
  }
  {
    std::vector<float> keys(3 * 128, 1.0f);
    std::vector<int64_t> key_slots = {5, 1, 5};
    std::vector<uint8_t> key_cache(2 * 16 * 68, 0);
    dsv4::StoreIndexerKeysParams k;
    k.keys = TensorView::contiguous(keys.data(), DType::kFloat32, {3, 128});
    k.slots = TensorView::contiguous(key_slots.data(), DType::kInt64, {3});
    k.cache = TensorView::contiguous(key_cache.data(), DType::kUInt8, {2, 16 * 68});
    k.block_size = 16;
    k.check_indices = true;
    expect_error([&] { dsv4::store_indexer_keys(k); }, "slots[2] = 5 repeats slots[0]");
    EXPECT_TRUE(std::all_of(key_cache.begin(), key_cache.end(), [](uint8_t x) { return x == 0; }));
  }
  {
    std::vector<uint8_t> cache(2 * 64 * 584, 0);
    std::vector<int32_t> slots = {7, 7, 7, 7};
    std::vector<float> out(4 * 512);
    dsv4::GatherEntriesParams g;
    g.cache = TensorView::contiguous(cache.data(), DType::kUInt8, {2, 64 * 584});
    g.block_size = 64;
    g.slots = TensorView::contiguous(slots.data(), DType::kInt32, {2, 2});
    g.out = TensorView::contiguous(out.data(), DType::kFloat32, {2, 2, 512});
    g.check_indices = true;
    EXPECT_NO_THROW(dsv4::gather_entries(g));
    g.out.strides[1] = 0;  // both columns of a row into one output row
    expect_error([&] { dsv4::gather_entries(g); }, "argument 'out' has stride 0 in dim 1");
  }
}

TEST(KvValidation, GatherAndKeysNameTheArgument) {
  std::vector<uint8_t> cache(2 * 64 * 584, 0);
  std::vector<int64_t> slots(6, 0);
  std::vector<float> out(6 * 512);
  dsv4::GatherEntriesParams g;
  g.cache = TensorView::contiguous(cache.data(), DType::kUInt8, {2, 64 * 584});
  g.block_size = 64;
  g.slots = TensorView::contiguous(slots.data(), DType::kInt64, {2, 3});
  g.out = TensorView::contiguous(out.data(), DType::kFloat32, {2, 3, 512});
  dsv4::gather_entries(g);
  auto bad = g;
  bad.out = TensorView::contiguous(out.data(), DType::kFloat32, {2, 3, 256});
  expect_error([&] { dsv4::gather_entries(bad); },
               "argument 'out' must have shape [N, L, 512] = [2, 3, 512], got [2, 3, 256]");
  bad = g;
  bad.out.dtype = DType::kFloat16;
  expect_error([&] { dsv4::gather_entries(bad); },
               "argument 'out' must have dtype float32 or bfloat16, got float16");
  slots[4] = 128;
  expect_error([&] { dsv4::gather_entries(g); }, "slots[1, 1] = 128 is beyond the cache");
  slots[4] = 0;

  std::vector<float> keys(3 * 128, 1.0f);
  std::vector<int32_t> key_slots = {0, 1, 2};
  std::vector<uint8_t> key_cache(2 * 16 * 68, 0);
  dsv4::StoreIndexerKeysParams k;
  k.keys = TensorView::contiguous(keys.data(), DType::kFloat32, {3, 128});
  k.slots = TensorView::contiguous(key_slots.data(), DType::kInt32, {3});
  k.cache = TensorView::contiguous(key_cache.data(), DType::kUInt8, {2, 16 * 68});
  k.block_size = 16;
  dsv4::store_indexer_keys(k);
  k.format = dsv4::KeyFormat::kNVFP4;
  expect_error([&] { dsv4::store_indexer_keys(k); },
               "argument 'cache' must have block_size * 72 = 1152 bytes per page (NVFP4");
  k.format = dsv4::KeyFormat::kFP8;
  expect_error([&] { dsv4::store_indexer_keys(k); },
               "argument 'cache' must have block_size * 132 = 2112 bytes per page (FP8 indexer "
               "keys, block_size = 16), got shape [2, 1088]");
  k.format = static_cast<dsv4::KeyFormat>(7);
  expect_error([&] { dsv4::store_indexer_keys(k); },
               "hdk::dsv4::store_indexer_keys: option 'format' must be KeyFormat::kMXFP4, kNVFP4 "
               "or kFP8, got 7");
  k.format = dsv4::KeyFormat::kMXFP4;
  k.keys = TensorView::contiguous(keys.data(), DType::kFloat32, {3, 64});
  expect_error([&] { dsv4::store_indexer_keys(k); }, "argument 'keys' must have shape [N, 128]");
  EXPECT_TRUE(std::all_of(key_cache.begin() + 3 * 64, key_cache.begin() + 16 * 64, [](uint8_t x) {
    return x == 0;
  })) << "a refused call wrote into the cache";

  // FP8 pages (132 bytes a key) are accepted by the store and the gather; the gather's own
  // format checks name their argument.
  std::vector<uint8_t> fp8_cache(2 * 16 * 132, 0);
  k.keys = TensorView::contiguous(keys.data(), DType::kFloat32, {3, 128});
  k.cache = TensorView::contiguous(fp8_cache.data(), DType::kUInt8, {2, 16 * 132});
  k.format = dsv4::KeyFormat::kFP8;
  dsv4::store_indexer_keys(k);
  std::vector<float> key_out(2 * 3 * 128);
  dsv4::GatherIndexerKeysParams gk;
  gk.cache = k.cache, gk.block_size = 16, gk.format = dsv4::KeyFormat::kFP8;
  gk.slots = TensorView::contiguous(slots.data(), DType::kInt64, {2, 3});
  gk.out = TensorView::contiguous(key_out.data(), DType::kFloat32, {2, 3, 128});
  dsv4::gather_indexer_keys(gk);
  gk.format = dsv4::KeyFormat::kNVFP4;
  expect_error([&] { dsv4::gather_indexer_keys(gk); },
               "hdk::dsv4::gather_indexer_keys: argument 'cache' must have block_size * 72 = "
               "1152 bytes per page (NVFP4 indexer keys, block_size = 16), got shape [2, 2112]");
  gk.format = static_cast<dsv4::KeyFormat>(-1);
  expect_error([&] { dsv4::gather_indexer_keys(gk); },
               "option 'format' must be KeyFormat::kMXFP4, kNVFP4 or kFP8, got -1");
}

TEST(KvValidation, CompressNamesTheArgument) {
  const int64_t N = 2, d = 512, m = 4, W = 2 * d;
  std::vector<float> kv(N * W), score(N * W), ape(m * W), state(3 * 3 * 3 * d), norm(d),
      cos_table(64 * 32), sin_table(64 * 32);
  std::vector<int64_t> positions = {0, 3};
  std::vector<int32_t> state_slots = {0, 2}, table = {0, 1, 1, 0};
  std::vector<uint8_t> cache(2 * 4 * 584);
  auto params = [&] {
    dsv4::CompressorParams p;
    p.kv = TensorView::contiguous(kv.data(), DType::kFloat32, {N, W});
    p.score = TensorView::contiguous(score.data(), DType::kFloat32, {N, W});
    p.ape = TensorView::contiguous(ape.data(), DType::kFloat32, {m, W});
    p.positions = TensorView::contiguous(positions.data(), DType::kInt64, {N});
    p.state_slots = TensorView::contiguous(state_slots.data(), DType::kInt32, {N});
    p.state = TensorView::contiguous(state.data(), DType::kFloat32, {3, 3, 3, d});
    p.norm_weight = TensorView::contiguous(norm.data(), DType::kFloat32, {d});
    p.rope_cos = TensorView::contiguous(cos_table.data(), DType::kFloat32, {64, 32});
    p.rope_sin = TensorView::contiguous(sin_table.data(), DType::kFloat32, {64, 32});
    p.block_table = TensorView::contiguous(table.data(), DType::kInt32, {N, 2});
    p.cache = TensorView::contiguous(cache.data(), DType::kUInt8, {2, 4 * 584});
    p.block_size = 4;
    p.ratio = m;
    return p;
  };
  dsv4::compress(params());
  auto p = params();
  p.key_format = static_cast<dsv4::KeyFormat>(3);  // d = 512 reads no key format
  dsv4::compress(p);
  p = params();
  p.ratio = 128;
  expect_error([&] { dsv4::compress(p); }, "argument 'kv' must have a last dimension of coff * d");
  p = params();
  p.state = TensorView::contiguous(state.data(), DType::kFloat32, {3, 1, 3, d});
  expect_error([&] { dsv4::compress(p); },
               "argument 'state' must have shape [num_states, A = 3 (CSA), 3, d] = [3, 3, 3, 512]");
  p = params();
  p.score.dtype = DType::kBFloat16;
  expect_error([&] { dsv4::compress(p); }, "argument 'score' must have the dtype of 'kv'");
  p = params();
  p.ape = TensorView::contiguous(ape.data(), DType::kFloat32, {m - 1, W});
  expect_error([&] { dsv4::compress(p); }, "argument 'ape' must have shape [ratio, coff*d]");
  p = params();
  p.kv = TensorView::contiguous(kv.data(), DType::kFloat32, {1, 5, W});
  p.score = TensorView::contiguous(score.data(), DType::kFloat32, {1, 5, W});
  expect_error([&] { dsv4::compress(p); }, "1 <= T <= ratio = 4");
  p = params();
  p.ratio = 1;
  expect_error([&] { dsv4::compress(p); }, "option 'ratio' must be 4 (CSA) or between 2 and 128");
  state_slots[1] = 3;
  expect_error([&] { dsv4::compress(params()); }, "state_slots[1] = 3 is beyond 'state'");
  state_slots[1] = 2;
  table[2] = 9;
  expect_error([&] { dsv4::compress(params()); },
               "block_table[1, 0] = 9 (for entry 0) is not a block of 'cache'");
  table[2] = 1;
  positions[1] = 64 * 4 - 1;
  expect_error([&] { dsv4::compress(params()); }, "beyond the RoPE tables' 64 rows");
  positions[1] = 3;
  state_slots = {2, 2};  // two requests folding tokens into one state
  expect_error([&] { dsv4::compress(params()); }, "state_slots[1] = 2 repeats state_slots[0]");
  state_slots = {0, 2};
  table = {1, 0, 1, 0};  // both rows complete entry 0 and page 0 is block 1 for both
  positions = {3, 3};
  expect_error([&] { dsv4::compress(params()); }, "rows 0 and 1 both write cache slot 4");
  table = {0, 1, 1, 0};
  positions = {0, 3};
  p = params();
  p.state.strides[0] = 0;  // every state slot in one place
  expect_error([&] { dsv4::compress(p); }, "argument 'state' has stride 0 in dim 0");
}

// d = 128 writes indexer keys: the cache's page size follows key_format, which must be one of
// the three formats; a refused call writes nothing.
TEST(KvValidation, CompressKeyFormat) {
  const int64_t N = 2, d = 128, m = 4, W = 2 * d;
  std::vector<float> kv(N * W, 0.25f), score(N * W), ape(m * W), state(3 * 3 * 3 * d),
      norm(d, 1.0f), cos_table(64 * 32, 1.0f), sin_table(64 * 32);
  std::vector<int64_t> positions = {0, 3};
  std::vector<int32_t> state_slots = {0, 2}, table = {0, 1, 1, 0};
  std::vector<uint8_t> cache(2 * 4 * 132, 0x11);
  dsv4::CompressorParams p;
  p.kv = TensorView::contiguous(kv.data(), DType::kFloat32, {N, W});
  p.score = TensorView::contiguous(score.data(), DType::kFloat32, {N, W});
  p.ape = TensorView::contiguous(ape.data(), DType::kFloat32, {m, W});
  p.positions = TensorView::contiguous(positions.data(), DType::kInt64, {N});
  p.state_slots = TensorView::contiguous(state_slots.data(), DType::kInt32, {N});
  p.state = TensorView::contiguous(state.data(), DType::kFloat32, {3, 3, 3, d});
  p.norm_weight = TensorView::contiguous(norm.data(), DType::kFloat32, {d});
  p.rope_cos = TensorView::contiguous(cos_table.data(), DType::kFloat32, {64, 32});
  p.rope_sin = TensorView::contiguous(sin_table.data(), DType::kFloat32, {64, 32});
  p.block_table = TensorView::contiguous(table.data(), DType::kInt32, {N, 2});
  p.cache = TensorView::contiguous(cache.data(), DType::kUInt8, {2, 4 * 132});
  p.block_size = 4;
  p.ratio = m;
  p.key_format = dsv4::KeyFormat::kMXFP4;
  expect_error([&] { dsv4::compress(p); },
               "hdk::dsv4::compress: argument 'cache' must have block_size * 68 = 272 bytes per "
               "page (MXFP4 indexer keys, block_size = 4), got shape [2, 528]");
  p.key_format = static_cast<dsv4::KeyFormat>(5);
  expect_error([&] { dsv4::compress(p); },
               "option 'key_format' must be KeyFormat::kMXFP4, kNVFP4 or kFP8, got 5");
  EXPECT_TRUE(std::all_of(cache.begin(), cache.end(), [](uint8_t x) { return x == 0x11; }));
  EXPECT_TRUE(std::all_of(state.begin(), state.end(), [](float x) { return x == 0.0f; }));
  p.key_format = dsv4::KeyFormat::kFP8;
  dsv4::compress(p);  // row 1 completes entry 0: block 1's first key
  const uint8_t* page = cache.data() + 4 * 132;
  EXPECT_FALSE(std::all_of(page, page + 128, [](uint8_t x) { return x == 0x11; }));
  float scale;
  std::memcpy(&scale, page + 4 * 128, 4);
  int exponent = 0;
  EXPECT_EQ(std::frexp(scale, &exponent), 0.5f) << "a power-of-two fp32 scale, got " << scale;
}

TEST(BlockAllocator, AllocateReleaseAndErrors) {
  dsv4::BlockAllocator allocator(5);
  EXPECT_EQ(allocator.free_count(), 5);
  EXPECT_EQ(allocator.allocate(3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(allocator.free_count(), 2);
  expect_error([&] { allocator.allocate(3); }, "cannot allocate 3 blocks: 2 of 5 are free");
  EXPECT_EQ(allocator.free_count(), 2);  // unchanged
  expect_error([&] { allocator.release({1, 7}); }, "cannot release block 7: not a block");
  expect_error([&] { allocator.release({1, 3}); }, "cannot release block 3: it is already free");
  expect_error([&] { allocator.release({1, 1}); }, "cannot release block 1: given twice");
  EXPECT_EQ(allocator.free_count(), 2);  // nothing released by the failed calls
  allocator.release({1});
  EXPECT_EQ(allocator.free_count(), 3);
  EXPECT_EQ(allocator.allocate(1), (std::vector<int32_t>{1}));  // the last released first
  const std::vector<int32_t> rest = allocator.allocate(2);
  EXPECT_EQ(rest, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(allocator.free_count(), 0);
  EXPECT_TRUE(allocator.allocate(0).empty());
  expect_error([&] { dsv4::BlockAllocator bad(-1); }, "num_blocks must be");
}

TEST(BlockAllocator, BlocksToReserve) {
  // CSA (ratio 4), 64 entries a page: the first entry appears at position 4.
  EXPECT_EQ(dsv4::blocks_to_reserve(4, 64, 0, 3), 0);
  EXPECT_EQ(dsv4::blocks_to_reserve(4, 64, 0, 4), 1);
  EXPECT_EQ(dsv4::blocks_to_reserve(4, 64, 4, 256), 0);
  EXPECT_EQ(dsv4::blocks_to_reserve(4, 64, 256, 260), 1);
  EXPECT_EQ(dsv4::blocks_to_reserve(128, 1, 0, 384), 3);
  EXPECT_EQ(dsv4::blocks_to_reserve(128, 2, 127, 129), 1);
  EXPECT_EQ(dsv4::blocks_to_reserve(4, 64, 100, 100), 0);
  expect_error([] { dsv4::blocks_to_reserve(4, 64, 9, 8); }, "position_before <= position_after");
  expect_error([] { dsv4::blocks_to_reserve(0, 64, 0, 8); }, "ratio >= 1");
}

}  // namespace
}  // namespace testing
}  // namespace hdk
