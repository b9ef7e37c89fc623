// The radix select's verdict on an entry once its prefix is chosen (src/topk/split_bounds.h), on
// the CPU: the bounds in 32-bit arithmetic against the comparison of whole 64-bit entries, for
// prefixes of every length the select reaches, drawn around random keys and at both ends of the
// key range.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "topk/split_bounds.h"
#include "topk/topk_key.h"

namespace hdk {
namespace {

using detail::ranked_entry;
using detail::SplitBounds;
using detail::SplitVerdict;
using detail::top_bits;

// What the select's pass decided before the bounds: the entry's top bits against the prefix.
SplitVerdict reference(uint64_t entry, uint64_t prefix, int prefix_bits, bool done) {
  const uint64_t top = top_bits(entry, prefix_bits);
  return SplitVerdict{top > prefix || (done && top == prefix), !done && top == prefix};
}

TEST(SplitBounds, EqualTheComparisonOfWholeEntries) {
  std::mt19937_64 rng(20261130);
  const int lengths[] = {11, 21, 22, 31, 32, 33, 43, 54, 64};
  for (const int prefix_bits : lengths) {
    for (const bool done : {false, true}) {
      for (int draw = 0; draw < 64; ++draw) {
        // The prefix of a random entry, or of the lowest and highest entries.
        uint64_t around = ranked_entry(static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()));
        if (draw == 0) around = 0;
        if (draw == 1) around = ~uint64_t{0};
        const uint64_t prefix = top_bits(around, prefix_bits);
        const SplitBounds bounds(prefix, prefix_bits, done, false);
        ASSERT_EQ(bounds.wide(), prefix_bits > 32);
        SCOPED_TRACE("prefix bits " + std::to_string(prefix_bits) + ", prefix " +
                     std::to_string(prefix) + (done ? ", done" : ""));
        for (int i = 0; i < 512; ++i) {
          // Entries near the prefix (a few low bits of its entry changed) and anywhere.
          uint64_t entry = around ^ (rng() >> (i % 64));
          if (i % 7 == 0) entry = rng();
          const uint32_t key = static_cast<uint32_t>(entry >> 32);
          const uint32_t column = 0xffffffffu - static_cast<uint32_t>(entry);
          ASSERT_EQ(ranked_entry(key, column), entry);
          const SplitVerdict want = reference(entry, prefix, prefix_bits, done);
          const SplitVerdict got = bounds.of(key, column);
          ASSERT_EQ(got.win, want.win) << "entry " << entry;
          ASSERT_EQ(got.maybe, want.maybe) << "entry " << entry;
          if (!bounds.wide()) {
            const SplitVerdict by_key = bounds.of_key(key);
            ASSERT_EQ(by_key.win, want.win) << "entry " << entry;
            ASSERT_EQ(by_key.maybe, want.maybe) << "entry " << entry;
          }
        }
      }
    }
  }
}

TEST(SplitBounds, EveryKeyWinsWhenAllAreSelected) {
  const SplitBounds bounds(0, 0, true, true);
  EXPECT_FALSE(bounds.wide());
  for (const uint32_t key : {0u, 1u, 0x007fffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu}) {
    const SplitVerdict verdict = bounds.of(key, 7);
    EXPECT_TRUE(verdict.win) << key;
    EXPECT_FALSE(verdict.maybe) << key;
  }
}

}  // namespace
}  // namespace hdk
