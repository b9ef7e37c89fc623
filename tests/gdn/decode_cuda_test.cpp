// CUDA-only GDN decode tests: 64-bit offsets in pools and caches larger than 4 GiB, CUDA-graph
// capture and replay, and untouched slots staying bit-identical. Skipped, with the reason,
// where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "hdk/error.h"
#include "support/gdn_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "gdn/cuda/decode_cuda.h"
#include "support/gdn_host_call.h"
#endif

namespace hdk {
namespace testing {
namespace {

#define HDK_SKIP_WITHOUT_CUDA()                                              \
  do {                                                                       \
    const std::string reason = backend_unavailable_reason(Backend::kCUDA);   \
    if (!reason.empty()) GTEST_SKIP() << "CUDA backend skipped: " << reason; \
  } while (0)

#ifdef HDK_WITH_CUDA

void check(cudaError_t status) {
  ASSERT_EQ(status, cudaSuccess) << cudaGetErrorString(status);
}

using gdn::detail::VKKernel;

// The launch override that forces the short or the general kernel, and the kernel it must
// launch for a VK-layout call.
gdn::detail::LaunchOverride forced_kernel(VKKernel kernel) {
  gdn::detail::LaunchOverride forced;
  forced.vk_kernel = kernel;
  return forced;
}

gdn::detail::DecodeKernel launched_kernel(VKKernel kernel) {
  return kernel == VKKernel::kShort ? gdn::detail::DecodeKernel::kVKShort
                                    : gdn::detail::DecodeKernel::kVKGeneral;
}

const char* kernel_name(VKKernel kernel) {
  return kernel == VKKernel::kShort ? "short kernel" : "general kernel";
}

// Runs a small case inside a much larger problem on the GPU: its slots are placed at
// `slot_of(s)` of a pool of `pool_slots`, and its requests at rows `row_of[n]` of a batch of
// `batch`, all other rows padding. The small case's buffers are rebuilt from the device
// afterwards, so the ordinary oracle comparison applies.
struct Embedding {
  int64_t pool_slots = 0;
  std::function<int64_t(int64_t)> slot_of;
  int64_t batch = 0;
  std::vector<int64_t> row_of;
};

BufferContents run_embedded(const GdnCase& c, const Embedding& e, std::vector<int64_t>* used,
                            std::vector<uint8_t>* neighbours_ok,
                            const gdn::detail::LaunchOverride& tuning,
                            gdn::detail::LaunchPlan* launched) {
  const GdnCaseConfig& config = c.config();
  const int64_t B = config.B;
  BufferContents result(c.buffers().size());
  std::vector<DeviceBuffer> memory;
  std::vector<void*> bases(c.buffers().size(), nullptr);
  std::vector<size_t> row_bytes(c.buffers().size(), 0);
  const std::vector<std::string> per_request = {
      "q", "k", "v", "a", "b", "g", "beta", "out", "intermediate_states", "state_indices"};
  for (size_t i = 0; i < c.buffers().size(); ++i) {
    const BufferSpec& buffer = c.buffers()[i];
    const bool is_row_tensor =
        std::find(per_request.begin(), per_request.end(), buffer.name) != per_request.end();
    if (buffer.name == "state") {
      const size_t slot_bytes = buffer.initial.size() / c.pool_size();
      memory.emplace_back(Backend::kCUDA, slot_bytes * e.pool_slots);
      memory.back().fill(0x5A);
      for (int64_t s = 0; s < c.pool_size(); ++s) {
        memory.back().upload(buffer.initial.data() + s * slot_bytes, slot_bytes,
                             e.slot_of(s) * slot_bytes);
      }
      row_bytes[i] = slot_bytes;
    } else if (is_row_tensor) {
      const size_t bytes_per_row = B > 0 ? buffer.initial.size() / B : 0;
      row_bytes[i] = bytes_per_row;
      memory.emplace_back(Backend::kCUDA, bytes_per_row * e.batch);
      if (buffer.output) {
        memory.back().fill(0xFF);  // poisoned like the small case's outputs
        bases[i] = memory.back().data();
        continue;
      }
      std::vector<uint8_t> big(bytes_per_row * e.batch);
      for (int64_t row = 0; row < e.batch; ++row) {
        // Rows the small case does not own repeat its row 0: padding never reads them.
        std::memcpy(big.data() + row * bytes_per_row, buffer.initial.data(), bytes_per_row);
      }
      if (buffer.name == "state_indices") {
        for (int64_t row = 0; row < e.batch; ++row) {
          if (buffer.dtype == DType::kInt64) {
            const int64_t pad = -1;
            std::memcpy(big.data() + row * 8, &pad, 8);
          } else {
            const int32_t pad = -1;
            std::memcpy(big.data() + row * 4, &pad, 4);
          }
        }
      }
      for (int64_t n = 0; n < B; ++n) {
        std::memcpy(big.data() + e.row_of[n] * bytes_per_row,
                    buffer.initial.data() + n * bytes_per_row, bytes_per_row);
        if (buffer.name == "state_indices") {
          int64_t slot = 0;
          if (buffer.dtype == DType::kInt64) {
            std::memcpy(&slot, big.data() + e.row_of[n] * 8, 8);
            if (slot >= 0 && slot < c.pool_size()) slot = e.slot_of(slot);
            std::memcpy(big.data() + e.row_of[n] * 8, &slot, 8);
          } else {
            int32_t narrow = 0;
            std::memcpy(&narrow, big.data() + e.row_of[n] * 4, 4);
            if (narrow >= 0 && narrow < c.pool_size())
              narrow = static_cast<int32_t>(e.slot_of(narrow));
            std::memcpy(big.data() + e.row_of[n] * 4, &narrow, 4);
          }
        }
      }
      memory.back().upload(big.data(), big.size());
    } else {
      memory.emplace_back(Backend::kCUDA, buffer.initial.size() + 1);
      memory.back().upload(buffer.initial.data(), buffer.initial.size());
    }
    bases[i] = memory.back().data();
  }

  gdn::DecodeParams params = c.bind(bases, Device::cuda(0));
  for (TensorView* view :
       {&params.q, &params.k, &params.v, &params.a, &params.b, &params.g, &params.beta, &params.out,
        &params.intermediate_states, &params.state_indices}) {
    if (view->defined()) view->shape[0] = e.batch;
  }
  params.state.shape[0] = e.pool_slots;
  *launched = gdn::detail::decode_tuned(params, nullptr, tuning);
  synchronize(Backend::kCUDA);

  for (size_t i = 0; i < c.buffers().size(); ++i) {
    const BufferSpec& buffer = c.buffers()[i];
    result[i].resize(buffer.initial.size());
    if (buffer.name == "state") {
      for (int64_t s = 0; s < c.pool_size(); ++s) {
        memory[i].download(result[i].data() + s * row_bytes[i], row_bytes[i],
                           e.slot_of(s) * row_bytes[i]);
        used->push_back(e.slot_of(s));
      }
      // Slots next to every used slot must still hold the fill pattern.
      std::vector<uint8_t> neighbour(row_bytes[i]);
      for (int64_t s = 0; s < c.pool_size(); ++s) {
        for (int64_t other : {e.slot_of(s) - 1, e.slot_of(s) + 1}) {
          if (other < 0 || other >= e.pool_slots ||
              std::find(used->begin(), used->end(), other) != used->end()) {
            continue;
          }
          memory[i].download(neighbour.data(), neighbour.size(), other * row_bytes[i]);
          bool intact = true;
          for (uint8_t byte : neighbour)
            intact = intact && byte == 0x5A;
          neighbours_ok->push_back(intact ? 1 : 0);
        }
      }
    } else if (buffer.name == "state_indices") {
      result[i] = buffer.initial;  // the device holds the remapped slots, by design
    } else if (row_bytes[i] > 0) {
      for (int64_t n = 0; n < B; ++n) {
        memory[i].download(result[i].data() + n * row_bytes[i], row_bytes[i],
                           e.row_of[n] * row_bytes[i]);
      }
    } else {
      memory[i].download(result[i].data(), result[i].size());
    }
  }
  return result;
}

#endif  // HDK_WITH_CUDA

// Slot byte offsets far past 4 GiB (int32 indices, 64-bit offsets), both layouts and dtypes.
TEST(GdnDecodeCuda, PoolLargerThan4GiB) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  for (VKKernel kernel : {VKKernel::kGeneral, VKKernel::kShort}) {
    const gdn::detail::LaunchOverride forced = forced_kernel(kernel);
    SCOPED_TRACE(kernel_name(kernel));
    for (DType state : {DType::kFloat32, DType::kBFloat16}) {
      for (gdn::StateLayout layout : {gdn::StateLayout::kVK, gdn::StateLayout::kKV}) {
        GdnCaseConfig config;
        config.B = 4, config.T = 2, config.H = 16, config.HV = 64, config.K = 128, config.V = 128;
        config.state_dtype = state;
        config.layout = layout;
        config.padding_fraction = 0.25;
        config.seed = 4242;
        SCOPED_TRACE(config.describe());
        const GdnCase c(config);
        const int64_t slot_bytes = 64 * 128 * 128 * static_cast<int64_t>(dtype_size(state));
        Embedding e;
        e.pool_slots = (int64_t{9} << 30) / 2 / slot_bytes + 16;  // 4.5 GiB of pool
        e.slot_of = [&](int64_t s) { return e.pool_slots - 2 - 3 * s; };
        e.batch = config.B;
        for (int64_t n = 0; n < config.B; ++n)
          e.row_of.push_back(n);
        ASSERT_GT(e.slot_of(0) * slot_bytes, int64_t{1} << 32);
        std::vector<int64_t> used;
        std::vector<uint8_t> neighbours_ok;
        gdn::detail::LaunchPlan launched;
        const BufferContents actual = run_embedded(c, e, &used, &neighbours_ok, forced, &launched);
        EXPECT_TRUE(outputs_match(c, run_reference(c), actual));
        EXPECT_EQ(launched.kernel, layout == gdn::StateLayout::kKV ? gdn::detail::DecodeKernel::kKV
                                                                   : launched_kernel(kernel));
        ASSERT_FALSE(neighbours_ok.empty());
        for (uint8_t ok : neighbours_ok)
          EXPECT_EQ(ok, 1) << "a slot next to a used one changed";
      }
    }
  }
#endif
}

// The verify cache of B * T * HV * V * K > 2^31 elements: requests at the end of the batch
// write past element 2^31 (an int32 offset would wrap).
TEST(GdnDecodeCuda, IntermediateCacheBeyond2To31Elements) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  for (VKKernel kernel : {VKKernel::kGeneral, VKKernel::kShort}) {
    const gdn::detail::LaunchOverride forced = forced_kernel(kernel);
    SCOPED_TRACE(kernel_name(kernel));
    GdnCaseConfig config;
    config.B = 3, config.T = 8, config.H = 16, config.HV = 64, config.K = 128, config.V = 128;
    config.state_dtype = DType::kBFloat16;
    config.intermediate = true;
    config.update_state = false;
    config.seed = 777;
    SCOPED_TRACE(config.describe());
    const GdnCase c(config);
    Embedding e;
    e.pool_slots = c.pool_size();
    e.slot_of = [](int64_t s) { return s; };
    e.batch = 260;  // 260 * 8 * 64 * 128 * 128 = 2.18e9 elements > 2^31
    e.row_of = {0, 258, 259};
    ASSERT_GT(e.batch * 8 * 64 * 128 * 128, int64_t{1} << 31);
    std::vector<int64_t> used;
    std::vector<uint8_t> neighbours_ok;
    gdn::detail::LaunchPlan launched;
    const BufferContents actual = run_embedded(c, e, &used, &neighbours_ok, forced, &launched);
    EXPECT_TRUE(outputs_match(c, run_reference(c), actual));
    EXPECT_EQ(launched.kernel, launched_kernel(kernel));
  }
#endif
}

#ifdef HDK_WITH_CUDA
// Captures one decode of `config` on a user stream, then replays it with fresh inputs, pool and
// indices written into the captured buffers.
void capture_and_replay(GdnCaseConfig config, const gdn::detail::LaunchOverride& tuning = {},
                        gdn::detail::LaunchPlan* launched = nullptr) {
  const GdnCase first(config);
  std::vector<DeviceBuffer> memory;
  std::vector<void*> bases;
  for (const BufferSpec& buffer : first.buffers()) {
    memory.emplace_back(Backend::kCUDA, buffer.initial.size() + 1);
    memory.back().upload(buffer.initial.data(), buffer.initial.size());
    bases.push_back(memory.back().data());
  }
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const gdn::detail::LaunchPlan plan =
      gdn::detail::decode_tuned(first.bind(bases, Device::cuda(0)), stream, tuning);
  if (launched != nullptr) *launched = plan;
  check(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0));

  const uint64_t first_seed = config.seed;
  for (uint64_t seed : {first_seed, first_seed + 1, first_seed + 2}) {
    config.seed = seed;
    const GdnCase c(config);
    for (size_t i = 0; i < c.buffers().size(); ++i) {
      memory[i].upload(c.buffers()[i].initial.data(), c.buffers()[i].initial.size());
    }
    check(cudaGraphLaunch(exec, stream));
    check(cudaStreamSynchronize(stream));
    BufferContents actual;
    for (size_t i = 0; i < memory.size(); ++i) {
      actual.emplace_back(c.buffers()[i].initial.size());
      memory[i].download(actual.back().data(), actual.back().size());
    }
    EXPECT_TRUE(outputs_match(c, run_reference(c), actual)) << "replay with seed " << seed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif  // HDK_WITH_CUDA

#ifdef HDK_WITH_CUDA
// The fp32 one-token call of the two tests below: B requests of 4 value heads of 16 rows each
// (two warps a head at 32 lanes x 8 rows), K = 128, random slots and 10% padding rows.
GdnCaseConfig fp32_one_token_call(int64_t B, uint64_t seed) {
  GdnCaseConfig config;
  config.B = B, config.T = 1, config.H = 2, config.HV = 4, config.K = 128, config.V = 16;
  config.state_dtype = DType::kFloat32;
  config.padding_fraction = 0.1;
  config.seed = seed;
  return config;
}

// The call on the CUDA backend against the float64 reference (outputs poisoned before the run).
::testing::AssertionResult cuda_matches_reference(const GdnCaseConfig& config) {
  const GdnCase test_case(config);
  return outputs_match(test_case, run_reference(test_case), run_backend(test_case, Backend::kCUDA));
}
#endif  // HDK_WITH_CUDA

// fp32 one-token calls from 4096 (request, value head) pairs run the common form's one-token
// build as 1-warp CTAs (plan_launch): that path, as the dispatcher picks it, against the float64
// reference, with random slots, padding rows and poisoned outputs.
TEST(GdnDecodeCuda, Fp32OneTokenCallsFrom4096HeadsMatchTheReference) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  const GdnCaseConfig config = fp32_one_token_call(1024, 9100);
  const gdn::detail::LaunchPlan chosen = plan_with(HostCall(config).problem());
  ASSERT_EQ(chosen.lanes_per_row, 32);
  ASSERT_EQ(chosen.rows_per_thread, 8);
  ASSERT_EQ(chosen.warps_per_cta, 1);
  ASSERT_TRUE(chosen.common_form);
  ASSERT_TRUE(chosen.one_token_build);
  EXPECT_TRUE(cuda_matches_reference(config));
#endif
}

// fp32 one-token calls of the common form load the state before the token's inputs beyond one
// wave and within half of one (plan_launch): that order, as the dispatcher picks it, against the
// float64 reference, in the fixed-length form and in SGLang's [1, B] + cu_seqlens decode step
// (each its own instance), with poisoned outputs, and with random slots and padding rows where
// there is a pool index.
TEST(GdnDecodeCuda, Fp32OneTokenCallsLoadingTheStateFirstMatchTheReference) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  struct Form {
    const char* name;
    int64_t B;
    bool decode_step;
    IndexKind indices;
  };
  // 600 x 4 heads of 2 warps: 4800 warps, more than 132 SMs hold (4224); 40 x 4 heads: 320.
  const Form forms[] = {
      {"fixed length, pool index", 600, false, IndexKind::kPerRequest},
      {"decode step with cu_seqlens, pool index", 600, true, IndexKind::kPerRequest},
      {"fixed length, dense states", 40, false, IndexKind::kNone}};
  uint64_t seed = 9201;
  for (const Form& form : forms) {
    SCOPED_TRACE(form.name);
    GdnCaseConfig config = fp32_one_token_call(form.B, seed++);
    config.indices = form.indices;
    if (form.indices == IndexKind::kNone) config.padding_fraction = 0.0;
    if (form.decode_step) {
      config.varlen_lengths.assign(static_cast<size_t>(config.B), 1);
      config.max_tokens_per_request = 1;
    }
    const gdn::detail::LaunchPlan chosen = plan_with(HostCall(config).problem());
    ASSERT_TRUE(chosen.common_form);
    ASSERT_TRUE(chosen.one_token_build);
    ASSERT_TRUE(chosen.state_first);
    EXPECT_TRUE(cuda_matches_reference(config));
  }
#endif
}

// A captured decode replays with whatever the buffers hold at replay time, on a user stream.
TEST(GdnDecodeCuda, GraphCaptureAndReplay) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  GdnCaseConfig config;
  config.B = 16, config.T = 1, config.H = 8, config.HV = 32, config.K = 128, config.V = 128;
  config.state_dtype = DType::kBFloat16;
  config.padding_fraction = 0.25;
  config.seed = 31;
  capture_and_replay(config);
#endif
}

// The same for a verify pass (T = 2, cache on) through the short and the general kernel.
TEST(GdnDecodeCuda, MultiTokenGraphCaptureAndReplay) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  for (VKKernel kernel : {VKKernel::kGeneral, VKKernel::kShort}) {
    const gdn::detail::LaunchOverride forced = forced_kernel(kernel);
    SCOPED_TRACE(kernel_name(kernel));
    GdnCaseConfig config;
    config.B = 8, config.T = 2, config.H = 8, config.HV = 32, config.K = 128, config.V = 128;
    config.state_dtype = DType::kBFloat16;
    config.intermediate = true;
    config.update_state = false;
    config.padding_fraction = 0.25;
    config.seed = 41;
    gdn::detail::LaunchPlan launched;
    capture_and_replay(config, forced, &launched);
    EXPECT_EQ(launched.kernel, launched_kernel(kernel));
  }
#endif
}

// check_indices on CUDA tensors reads the indices back and throws like the CPU does.
TEST(GdnDecodeCuda, CheckIndicesThrowsForBadIndex) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  GdnCaseConfig config;
  config.B = 4, config.K = 64, config.V = 64;
  config.invalid_rows = 1;
  const GdnCase c(config);
  std::vector<DeviceBuffer> memory;
  std::vector<void*> bases;
  for (const BufferSpec& buffer : c.buffers()) {
    memory.emplace_back(Backend::kCUDA, buffer.initial.size() + 1);
    memory.back().upload(buffer.initial.data(), buffer.initial.size());
    bases.push_back(memory.back().data());
  }
  gdn::DecodeParams params = c.bind(bases, Device::cuda(0));
  params.check_indices = true;
  EXPECT_THROW(gdn::decode(params), Error);
  params.check_indices = false;
  EXPECT_NO_THROW(gdn::decode(params));
  synchronize(Backend::kCUDA);
#endif
}

// The CUDA kernels cover K of 64/128/256; other sizes are a clear error, not a wrong answer.
TEST(GdnDecodeCuda, UnsupportedHeadSizeIsAnError) {
  HDK_SKIP_WITHOUT_CUDA();
#ifdef HDK_WITH_CUDA
  GdnCaseConfig config;
  config.K = 96, config.V = 64;
  const GdnCase c(config);
  std::vector<DeviceBuffer> memory;
  std::vector<void*> bases;
  for (const BufferSpec& buffer : c.buffers()) {
    memory.emplace_back(Backend::kCUDA, buffer.initial.size() + 1);
    bases.push_back(memory.back().data());
  }
  try {
    gdn::decode(c.bind(bases, Device::cuda(0)));
    ADD_FAILURE() << "no error for K = 96";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("K = 64, 128 or 256"), std::string::npos)
        << error.what();
  }
#endif
}

}  // namespace
}  // namespace testing
}  // namespace hdk
