// Pages of DeepSeek-V4's compressed pools, handed out on the host before a step runs (never
// inside a captured CUDA graph). Rules: docs/dsv4-kv-cache.md, section "Block allocator".
#pragma once

#include <cstdint>
#include <vector>

namespace hdk {
namespace dsv4 {

class BlockAllocator {
 public:
  // Block ids 0 .. num_blocks - 1, all free. num_blocks >= 0.
  explicit BlockAllocator(int64_t num_blocks);

  // `count` free ids (lowest first on a fresh allocator). Throws hdk::Error naming the free and
  // the requested counts when fewer than `count` are free, and then changes nothing.
  std::vector<int32_t> allocate(int64_t count);

  // Returns ids to the pool. Throws hdk::Error, changing nothing, for an id outside the pool,
  // one that is already free, or one given twice.
  void release(const std::vector<int32_t>& ids);

  int64_t free_count() const { return static_cast<int64_t>(free_ids_.size()); }
  int64_t capacity() const { return static_cast<int64_t>(is_free_.size()); }

 private:
  std::vector<int32_t> free_ids_;  // a stack: the most recently released id is reused first
  std::vector<uint8_t> is_free_;
};

// Blocks a request needs in addition to what it holds when its position (tokens seen) goes from
// position_before to position_after: ceil((position_after / ratio) / block_size) -
// ceil((position_before / ratio) / block_size), integer divisions, never negative.
int64_t blocks_to_reserve(int64_t ratio, int64_t block_size, int64_t position_before,
                          int64_t position_after);

}  // namespace dsv4
}  // namespace hdk
