// Non-finite inputs (docs/gdn-decode.md, "Non-finite inputs"): a NaN or an infinity in an input
// of one (request, value head) at token t refuses that head from t on. Its output rows of tokens
// t.. are NaN, every state block it would write from t on (the final slot, per-token slots and
// intermediate states of tokens t..) keeps its bytes, the counter adds one per refused head, and
// everything else (the head's tokens before t included) is bit-identical to the same call without
// the bad value. The float64 reference defines the rule; every backend (and every CUDA kernel the
// dispatcher can pick) is held to it byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "hdk/dtype.h"
#include "hdk/gdn/decode.h"
#include "support/gdn_case.h"
#include "support/gdn_host_call.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_cuda.h"
#endif

namespace hdk {
namespace testing {
namespace {

enum class Bad { kNaN, kPlusInf, kMinusInf };

// The bytes of a NaN or an infinity in `dtype` at element `index`.
void put_nonfinite(std::vector<uint8_t>& bytes, DType dtype, int64_t index, Bad bad) {
  if (dtype == DType::kFloat32) {
    const uint32_t bits = bad == Bad::kNaN       ? 0x7fc00000u
                          : bad == Bad::kPlusInf ? 0x7f800000u
                                                 : 0xff800000u;
    std::memcpy(&bytes[static_cast<size_t>(index) * 4], &bits, 4);
    return;
  }
  const bool bf16 = dtype == DType::kBFloat16;
  const uint16_t bits = bad == Bad::kNaN       ? (bf16 ? 0x7fc0u : 0x7e00u)
                        : bad == Bad::kPlusInf ? (bf16 ? 0x7f80u : 0x7c00u)
                                               : (bf16 ? 0xff80u : 0xfc00u);
  std::memcpy(&bytes[static_cast<size_t>(index) * 2], &bits, 2);
}

int buffer_named(const GdnCase& test_case, const std::string& name) {
  for (size_t i = 0; i < test_case.buffers().size(); ++i) {
    if (test_case.buffers()[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int64_t counter_value(const std::vector<uint8_t>& bytes) {
  if (bytes.size() == 4) {
    int32_t value;
    std::memcpy(&value, bytes.data(), 4);
    return value;
  }
  int64_t value;
  std::memcpy(&value, bytes.data(), 8);
  return value;
}

bool is_nan_element(const std::vector<uint8_t>& bytes, DType dtype, int64_t e) {
  if (dtype == DType::kFloat32) {
    float x;
    std::memcpy(&x, &bytes[static_cast<size_t>(e) * 4], 4);
    return std::isnan(x);
  }
  uint16_t bits;
  std::memcpy(&bits, &bytes[static_cast<size_t>(e) * 2], 2);
  const uint16_t exponent = dtype == DType::kBFloat16 ? 0x7f80u : 0x7c00u;
  const uint16_t mantissa = dtype == DType::kBFloat16 ? 0x007fu : 0x03ffu;
  return (bits & exponent) == exponent && (bits & mantissa) != 0;
}

bool block_equal(const std::vector<uint8_t>& x, const std::vector<uint8_t>& y, size_t begin,
                 size_t size) {
  return std::memcmp(&x[begin], &y[begin], size) == 0;
}

// Where one bad value goes: a per-token tensor, and the request, token, head and element.
struct Injection {
  const char* tensor;
  int64_t n, t, head, element;
  Bad bad;
};

std::string describe(const Injection& at) {
  const char* kinds[] = {"NaN", "+inf", "-inf"};
  return std::string(kinds[static_cast<int>(at.bad)]) + " in " + at.tensor +
         "[n=" + std::to_string(at.n) + ", t=" + std::to_string(at.t) +
         ", head=" + std::to_string(at.head) + ", element=" + std::to_string(at.element) + "]";
}

// The case's buffers with `out` filled with a finite pattern instead of the case's NaN bytes, so
// that a NaN found there was written by the call.
BufferContents finite_poisoned_out(const GdnCase& test_case) {
  BufferContents contents;
  for (const BufferSpec& buffer : test_case.buffers()) {
    contents.push_back(buffer.initial);
    if (buffer.name == "out") std::fill(contents.back().begin(), contents.back().end(), 0x3c);
  }
  return contents;
}

// `inputs` with the bad value written in.
BufferContents poisoned_inputs(const GdnCase& test_case, const BufferContents& inputs,
                               const Injection& at) {
  BufferContents contents = inputs;
  const std::string name = at.tensor;
  const ViewSpec& view = name == "q"   ? test_case.q
                         : name == "k" ? test_case.k
                         : name == "v" ? test_case.v
                         : name == "a" ? test_case.a
                         : name == "b" ? test_case.b
                         : name == "g" ? test_case.g
                                       : test_case.beta;
  int64_t index =
      view.offset + at.n * view.strides[0] + at.t * view.strides[1] + at.head * view.strides[2];
  if (view.shape.size() == 4) index += at.element * view.strides[3];
  put_nonfinite(contents[static_cast<size_t>(view.buffer)], view.dtype, index, at.bad);
  return contents;
}

// What the reference did with the bad value: the refused heads and the state blocks (of V x K
// elements, in the pool and the intermediates) they left as they were.
struct Refusal {
  std::set<int64_t> heads;
  std::vector<std::vector<bool>> kept_blocks;  // per buffer; empty for non-state buffers
};

Refusal reference_refusal(const GdnCase& test_case, const BufferContents& clean,
                          const BufferContents& poisoned) {
  const GdnCaseConfig& c = test_case.config();
  Refusal refusal;
  refusal.kept_blocks.resize(test_case.buffers().size());
  for (size_t i = 0; i < test_case.buffers().size(); ++i) {
    const BufferSpec& buffer = test_case.buffers()[i];
    if (buffer.name != "state" && buffer.name != "intermediate_states") continue;
    const size_t block = static_cast<size_t>(c.V * c.K) * dtype_size(buffer.dtype);
    const size_t blocks = buffer.initial.size() / block;
    refusal.kept_blocks[i].assign(blocks, false);
    for (size_t index = 0; index < blocks; ++index) {
      const size_t begin = index * block;
      const bool written_clean = !block_equal(clean[i], buffer.initial, begin, block);
      const bool kept = block_equal(poisoned[i], buffer.initial, begin, block);
      if (written_clean && kept) {
        refusal.kept_blocks[i][index] = true;
        refusal.heads.insert(static_cast<int64_t>(index) % c.HV);  // slot pitch = HV * V * K
      }
    }
  }
  return refusal;
}

// `actual` (the backend with the bad value) against `clean` (the backend without it): the
// refused rows NaN, the refused blocks as they were, the rest bit-identical.
::testing::AssertionResult refused_exactly(const GdnCase& test_case, const Refusal& refusal,
                                           const BufferContents& reference_poisoned,
                                           const BufferContents& clean,
                                           const BufferContents& actual) {
  const GdnCaseConfig& c = test_case.config();
  for (size_t i = 0; i < test_case.buffers().size(); ++i) {
    const BufferSpec& buffer = test_case.buffers()[i];
    if (!buffer.output) continue;
    if (buffer.name == "nonfinite_head_count" || buffer.name == "invalid_index_count") {
      if (actual[i] != reference_poisoned[i]) {
        return ::testing::AssertionFailure()
               << "'" << buffer.name << "' is " << counter_value(actual[i]) << ", expected "
               << counter_value(reference_poisoned[i]);
      }
      continue;
    }
    const size_t element = dtype_size(buffer.dtype);
    if (buffer.name == "out") {
      const int64_t count = static_cast<int64_t>(actual[i].size() / element);
      for (int64_t e = 0; e < count; ++e) {
        const bool refused = is_nan_element(reference_poisoned[i], buffer.dtype, e);
        if (refused && !is_nan_element(actual[i], buffer.dtype, e)) {
          return ::testing::AssertionFailure()
                 << "'out' element " << e << " (head " << (e / c.V) % c.HV
                 << ") of a refused head is not NaN";
        }
        if (!refused && std::memcmp(&actual[i][e * element], &clean[i][e * element], element)) {
          return ::testing::AssertionFailure()
                 << "'out' element " << e << " (head " << (e / c.V) % c.HV
                 << ") differs from the call without the bad value";
        }
      }
      continue;
    }
    const size_t block = static_cast<size_t>(c.V * c.K) * element;
    for (size_t index = 0; index * block < actual[i].size(); ++index) {
      const size_t begin = index * block;
      const size_t size = std::min(block, actual[i].size() - begin);
      if (refusal.kept_blocks[i][index]) {
        if (!block_equal(actual[i], buffer.initial, begin, size)) {
          return ::testing::AssertionFailure()
                 << "'" << buffer.name << "' block " << index << " (head " << index % c.HV
                 << ") of a refused head was written";
        }
      } else if (!block_equal(actual[i], clean[i], begin, size)) {
        return ::testing::AssertionFailure()
               << "'" << buffer.name << "' block " << index << " (head " << index % c.HV
               << ") differs from the call without the bad value";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<GdnCaseConfig> nonfinite_cases() {
  std::vector<GdnCaseConfig> cases;
  auto base = [](uint64_t seed) {
    GdnCaseConfig c;
    c.B = 4, c.H = 2, c.HV = 4, c.K = 64, c.V = 64;
    c.padding_fraction = 0.0;
    c.seed = seed;
    return c;
  };
  GdnCaseConfig c = base(901);  // one token, fp32 pool, per-request slots
  cases.push_back(c);
  c = base(902);  // bf16 pool, split pool, int64 indices and counters
  c.state_dtype = DType::kBFloat16;
  c.split_pool = true;
  c.index_dtype = DType::kInt64;
  cases.push_back(c);
  c = base(903);  // a real shape: the dispatcher's common one-token path on CUDA
  c.B = 3, c.H = 16, c.HV = 32, c.K = 128, c.V = 128;
  c.state_dtype = DType::kBFloat16;
  cases.push_back(c);
  c.seed = 904;
  c.state_dtype = DType::kFloat32;
  cases.push_back(c);
  c = base(905);  // three tokens, intermediates, per-token slots
  c.T = 3;
  c.intermediate = true;
  c.indices = IndexKind::kPerToken;
  c.num_accepted_tokens = true;
  cases.push_back(c);
  c = base(906);  // precomputed gating, fp32 inputs, bf16 pool, two tokens with intermediates
  c.T = 2;
  c.fused_gating = false;
  c.input_dtype = DType::kFloat32;
  c.out_dtype = DType::kFloat32;
  c.state_dtype = DType::kBFloat16;
  c.intermediate = true;
  cases.push_back(c);
  c = base(907);  // layout kKV, two tokens
  c.T = 2;
  c.layout = gdn::StateLayout::kKV;
  c.input_dtype = DType::kFloat16;
  c.gate_dtype = DType::kFloat16;
  c.out_dtype = DType::kFloat16;
  cases.push_back(c);
  // Layout kKV, tokens past the first eight-token chunk and past one a warp: the kernel tests
  // their v rows with loads of their own.
  c = base(909);
  c.T = 11;
  c.layout = gdn::StateLayout::kKV;
  c.state_dtype = DType::kBFloat16;
  c.intermediate = true;
  cases.push_back(c);
  c = base(908);  // more tokens than one 32-token window of the v check (the general kernel)
  c.T = 35;
  c.intermediate = true;
  cases.push_back(c);
  return cases;
}

#ifdef HDK_WITH_CUDA
// The kernels the dispatcher may pick for one call, each forced in turn: the rule must not
// depend on which one ran.
std::vector<gdn::detail::LaunchOverride> forced_kernels() {
  using gdn::detail::LaunchOverride;
  std::vector<LaunchOverride> runs(7);
  // Run 1 forces the one-token sweep kernel where this build has it (built_kernels.h), and is
  // the dispatcher's choice again otherwise.
  runs[1].one_token_sweep = gdn::detail::kOneTokenSweepKernelBuilt;
  runs[2].vk_kernel = gdn::detail::VKKernel::kGeneral;
  runs[3].vk_kernel = gdn::detail::VKKernel::kShort;
  runs[3].short_build = gdn::detail::ShortBuild::kTokenLoop;
  runs[4] = runs[3];
  runs[4].short_build = gdn::detail::ShortBuild::kOneToken;
  runs[5] = runs[4];
  runs[5].full_problem = true;
  runs[6] = runs[4];
  runs[6].load_order = gdn::detail::ShortLoadOrder::kStateFirst;
  return runs;
}
#endif

TEST(GdnDecodeNonfinite, RefusesTheHeadFromTheBadTokenOn) {
  const std::vector<GdnCaseConfig> configs = nonfinite_cases();
  for (size_t index = 0; index < configs.size(); ++index) {
    const GdnCaseConfig& config = configs[index];
    SCOPED_TRACE(config.describe());
    const GdnCase test_case(config);
    const BufferContents inputs = finite_poisoned_out(test_case);
    const BufferContents reference_clean = run_reference(test_case, &inputs);
    const int out = buffer_named(test_case, "out");
    const int counter = buffer_named(test_case, "nonfinite_head_count");
    ASSERT_GE(counter, 0);
    EXPECT_EQ(counter_value(reference_clean[counter]), 7) << "a clean call refuses nothing";

    const int64_t n = 1 + static_cast<int64_t>(index) % (config.B - 1);
    const int64_t t = config.T - 1;
    const int64_t hv = (3 * static_cast<int64_t>(index) + 1) % config.HV;
    const int64_t h = hv / (config.HV / config.H);
    const int64_t heads_per_qk_head = config.HV / config.H;
    std::vector<Injection> injections = {
        {"q", n, t, h, (7 * static_cast<int64_t>(index)) % config.K, Bad::kNaN},
        {"k", n, config.T / 2, h, 1, Bad::kMinusInf},
        {"v", n, config.T / 2, hv, 0, Bad::kPlusInf},
        {"k", n, t, h, config.K - 1, Bad::kPlusInf},
        {"v", n, t, hv, (5 * static_cast<int64_t>(index) + 3) % config.V, Bad::kNaN},
        {"v", n, 0, hv, config.V - 1, Bad::kMinusInf},
        {config.fused_gating ? "a" : "g", n, t, hv, 0, Bad::kNaN},
        {config.fused_gating ? "b" : "beta", n, 0, hv, 0, Bad::kPlusInf},
    };
    for (const Injection& at : injections) {
      SCOPED_TRACE(describe(at));
      const BufferContents poisoned = poisoned_inputs(test_case, inputs, at);
      const BufferContents reference_poisoned = run_reference(test_case, &poisoned);

      // The reference: the refused heads are those of the bad value, no more.
      const Refusal refusal = reference_refusal(test_case, reference_clean, reference_poisoned);
      const bool qk = std::string(at.tensor) == "q" || std::string(at.tensor) == "k";
      std::set<int64_t> expected_heads;
      for (int64_t head = 0; head < config.HV; ++head) {
        if (qk ? head / heads_per_qk_head == at.head : head == at.head) expected_heads.insert(head);
      }
      EXPECT_EQ(refusal.heads, expected_heads);
      EXPECT_EQ(counter_value(reference_poisoned[counter]),
                7 + static_cast<int64_t>(expected_heads.size()));
      const DType out_dtype = test_case.buffers()[out].dtype;
      for (int64_t token = 0; token < config.T; ++token) {
        for (int64_t head = 0; head < config.HV; ++head) {
          const int64_t first = ((n * config.T + token) * config.HV + head) * config.V;
          EXPECT_EQ(is_nan_element(reference_poisoned[out], out_dtype, first),
                    expected_heads.count(head) == 1 && token >= at.t)
              << "reference out[n, " << token << ", " << head << "]";
        }
      }
      EXPECT_TRUE(refused_exactly(test_case, refusal, reference_poisoned, reference_clean,
                                  reference_poisoned));

      for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
        if (!backend_unavailable_reason(backend).empty()) continue;
        SCOPED_TRACE(backend_name(backend));
#ifdef HDK_WITH_CUDA
        const std::vector<gdn::detail::LaunchOverride> runs =
            backend == Backend::kCUDA ? forced_kernels()
                                      : std::vector<gdn::detail::LaunchOverride>(1);
#else
        const int runs[1] = {0};
#endif
        for (size_t run = 0; run < std::size(runs); ++run) {
          SCOPED_TRACE("forced kernel set " + std::to_string(run));
          BufferContents clean, actual;
#ifdef HDK_WITH_CUDA
          if (backend == Backend::kCUDA) {
            gdn::detail::LaunchPlan launched;
            clean = run_cuda_tuned(test_case, runs[run], &launched, &inputs);
            EXPECT_TRUE(launched_as_planned(test_case, runs[run], launched));
            actual = run_cuda_tuned(test_case, runs[run], nullptr, &poisoned);
          }
#endif
          if (backend == Backend::kCPU) {
            clean = run_backend(test_case, backend, &inputs);
            actual = run_backend(test_case, backend, &poisoned);
          }
          EXPECT_TRUE(outputs_match(test_case, reference_clean, clean));
          EXPECT_TRUE(refused_exactly(test_case, refusal, reference_poisoned, clean, actual));
        }
      }
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace hdk
