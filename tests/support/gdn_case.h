// One randomized GDN decode call for the tests: host buffers with random inputs and a random
// pool, poisoned outputs, index tensors that exercise the pool semantics, and the views that
// bind them. Run it through the float64 reference and through a backend, then compare.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hdk/gdn/decode.h"
#include "support/device_memory.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/decode_cuda.h"
#endif

namespace hdk {
namespace testing {

enum class IndexKind { kNone, kPerRequest, kPerToken };

struct GdnCaseConfig {
  int64_t B = 2, T = 1, H = 2, HV = 4, K = 16, V = 16;
  DType input_dtype = DType::kBFloat16;  // q, k, v
  DType gate_dtype = DType::kBFloat16;   // a, b
  DType dt_bias_dtype = DType::kFloat32;
  DType state_dtype = DType::kFloat32;
  DType out_dtype = DType::kBFloat16;
  DType index_dtype = DType::kInt32;
  gdn::StateLayout layout = gdn::StateLayout::kVK;
  bool fused_gating = true;
  bool use_qk_l2norm = true;
  float scale = 0.0f;
  IndexKind indices = IndexKind::kPerRequest;
  bool num_accepted_tokens = false;  // with IndexKind::kPerToken
  bool split_pool = false;           // output_state_indices
  bool shuffle_slots = true;
  double padding_fraction = 0.0;   // rows whose read index is -1
  double no_write_fraction = 0.0;  // split pool: rows whose output index is -1
  int invalid_rows = 0;            // rows with an index >= P
  int64_t extra_slots = 3;
  int64_t slot_padding_rows = 0;  // extra state rows between consecutive slots (slot pitch)
  bool packed_inputs = false;     // q/k/v and a/b as strided slices of packed buffers
  bool intermediate = false;
  int64_t capacity = 0;  // C of intermediates / 2-D indices; 0 means T (or the longest request)
  bool update_state = true;
  std::vector<int64_t> varlen_lengths;  // non-empty: cu_seqlens mode with these token counts
  int64_t max_tokens_per_request = 0;   // DecodeParams::max_tokens_per_request
  bool count_invalid = true;
  bool count_nonfinite = true;  // nonfinite_head_count, starting at 7
  uint64_t seed = 1;

  std::string describe() const;
};

struct BufferSpec {
  std::string name;
  std::vector<uint8_t> initial;
  DType dtype = DType::kFloat32;
  bool output = false;     // compared after the call
  int64_t row_length = 1;  // elements compared as one row
};

struct ViewSpec {
  int buffer = -1;     // -1: not given
  int64_t offset = 0;  // elements
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

using BufferContents = std::vector<std::vector<uint8_t>>;

class GdnCase {
 public:
  explicit GdnCase(const GdnCaseConfig& config);

  const GdnCaseConfig& config() const { return config_; }
  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  int64_t pool_size() const { return pool_size_; }
  int64_t expected_invalid() const { return expected_invalid_; }
  double tolerance() const;

  // The call, with every view pointing into `bases` (one pointer per buffer) on `device`.
  gdn::DecodeParams bind(const std::vector<void*>& bases, Device device) const;

  // Replaces the params' views after binding (for tests that break one argument).
  ViewSpec q, k, v, A_log, a, dt_bias, b, g, beta, state, state_indices, output_state_indices,
      num_accepted_tokens, cu_seqlens, intermediate_states, out, invalid_index_count,
      nonfinite_head_count;

 private:
  int add_buffer(BufferSpec spec);
  GdnCaseConfig config_;
  std::vector<BufferSpec> buffers_;
  int64_t pool_size_ = 0;
  int64_t expected_invalid_ = 0;
};

// Runs decode_reference on host copies of the case's buffers (or of `initial`, one entry per
// buffer) and returns them afterwards.
BufferContents run_reference(const GdnCase& test_case, const BufferContents* initial = nullptr);

// Runs hdk::gdn::decode on `backend` (copying the buffers, or `initial`, there and back).
BufferContents run_backend(const GdnCase& test_case, Backend backend,
                           const BufferContents* initial = nullptr);

#ifdef HDK_WITH_CUDA
// run_backend on CUDA with the kernel choices `tuning` forces; `launched` (when given) receives
// the plan that ran.
BufferContents run_cuda_tuned(const GdnCase& test_case, const gdn::detail::LaunchOverride& tuning,
                              gdn::detail::LaunchPlan* launched = nullptr,
                              const BufferContents* initial = nullptr);
#endif

// Checks every output buffer: bytes the reference left untouched must be untouched (bit for
// bit), written rows within tolerance (per row and over the whole buffer), no NaN/Inf.
::testing::AssertionResult outputs_match(const GdnCase& test_case, const BufferContents& expected,
                                         const BufferContents& actual);

// Random floats in `dtype` bytes, normal(mean, stddev).
std::vector<uint8_t> random_floats(DType dtype, int64_t count, uint64_t seed, double mean,
                                   double stddev);

}  // namespace testing
}  // namespace hdk
