#include "hdk/dsv4/block_allocator.h"

#include <string>

#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error("hdk::dsv4::BlockAllocator: " + message);
}

}  // namespace

BlockAllocator::BlockAllocator(int64_t num_blocks) {
  if (num_blocks < 0 || num_blocks > INT32_MAX) {
    fail("num_blocks must be 0 .. 2^31 - 1, got " + std::to_string(num_blocks));
  }
  is_free_.assign(static_cast<size_t>(num_blocks), 1);
  free_ids_.reserve(static_cast<size_t>(num_blocks));
  // A stack whose top is the lowest id, so a fresh allocator hands out 0, 1, 2, ...
  for (int64_t id = num_blocks - 1; id >= 0; --id)
    free_ids_.push_back(static_cast<int32_t>(id));
}

std::vector<int32_t> BlockAllocator::allocate(int64_t count) {
  if (count < 0)
    fail("cannot allocate a negative number of blocks (" + std::to_string(count) + ")");
  if (count > free_count()) {
    fail("cannot allocate " + std::to_string(count) + " blocks: " + std::to_string(free_count()) +
         " of " + std::to_string(capacity()) + " are free");
  }
  std::vector<int32_t> ids(free_ids_.end() - count, free_ids_.end());
  std::vector<int32_t>(ids.rbegin(), ids.rend()).swap(ids);  // pop order
  free_ids_.resize(free_ids_.size() - static_cast<size_t>(count));
  for (int32_t id : ids)
    is_free_[static_cast<size_t>(id)] = 0;
  return ids;
}

void BlockAllocator::release(const std::vector<int32_t>& ids) {
  // Check everything first, so a bad call changes nothing.
  std::vector<uint8_t> seen(is_free_.size(), 0);
  for (int32_t id : ids) {
    if (id < 0 || id >= capacity()) {
      fail("cannot release block " + std::to_string(id) + ": not a block of this pool (0 .. " +
           std::to_string(capacity() - 1) + ")");
    }
    if (is_free_[static_cast<size_t>(id)]) {
      fail("cannot release block " + std::to_string(id) + ": it is already free");
    }
    if (seen[static_cast<size_t>(id)]) {
      fail("cannot release block " + std::to_string(id) + ": given twice in one call");
    }
    seen[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id : ids) {
    is_free_[static_cast<size_t>(id)] = 1;
    free_ids_.push_back(id);
  }
}

int64_t blocks_to_reserve(int64_t ratio, int64_t block_size, int64_t position_before,
                          int64_t position_after) {
  if (ratio < 1 || block_size < 1) {
    fail("blocks_to_reserve needs ratio >= 1 and block_size >= 1, got ratio " +
         std::to_string(ratio) + ", block_size " + std::to_string(block_size));
  }
  if (position_before < 0 || position_after < position_before) {
    fail("blocks_to_reserve needs 0 <= position_before <= position_after, got " +
         std::to_string(position_before) + " and " + std::to_string(position_after));
  }
  auto blocks = [&](int64_t position) {
    const int64_t entries = position / ratio;
    return (entries + block_size - 1) / block_size;
  };
  return blocks(position_after) - blocks(position_before);
}

}  // namespace dsv4
}  // namespace hdk
