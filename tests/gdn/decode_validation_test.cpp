// Every invalid call is a clear hdk::Error naming the argument: never a crash, never a silent
// wrong answer. The same validation serves every backend, so these run on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "hdk/error.h"
#include "hdk/gdn/decode.h"
#include "hdk/version.h"
#include "support/gdn_case.h"

namespace hdk {
namespace testing {
namespace {

// A valid call on host memory that a test then breaks in one place.
class BrokenCall {
 public:
  explicit BrokenCall(GdnCaseConfig config = default_config()) : case_(config) {
    for (const BufferSpec& buffer : case_.buffers()) {
      memory_.push_back(buffer.initial);
      memory_.back().resize(memory_.back().size() + 64);
    }
    for (auto& bytes : memory_)
      bases_.push_back(bytes.data());
    params = case_.bind(bases_, Device::cpu());
  }

  static GdnCaseConfig default_config() {
    GdnCaseConfig c;
    c.B = 3, c.T = 2, c.H = 2, c.HV = 4, c.K = 16, c.V = 8;
    return c;
  }

  void* buffer(const char* name) {
    for (size_t i = 0; i < case_.buffers().size(); ++i) {
      if (case_.buffers()[i].name == name) return bases_[i];
    }
    return nullptr;
  }

  gdn::DecodeParams params;

 private:
  GdnCase case_;
  std::vector<std::vector<uint8_t>> memory_;
  std::vector<void*> bases_;
};

// The call must throw hdk::Error whose message contains every fragment.
void expect_error(const gdn::DecodeParams& params, const std::vector<std::string>& fragments) {
  try {
    gdn::decode(params);
    ADD_FAILURE() << "no hdk::Error thrown; expected one mentioning '" << fragments.front() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("hdk::gdn::decode"), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    }
  }
}

TEST(GdnDecodeValidation, ValidCallPasses) {
  BrokenCall call;
  EXPECT_NO_THROW(gdn::decode(call.params));
}

TEST(GdnDecodeValidation, RequiredArguments) {
  for (const char* name : {"q", "k", "v", "state", "out"}) {
    BrokenCall call;
    gdn::DecodeParams& p = call.params;
    TensorView* view = std::string(name) == "q"       ? &p.q
                       : std::string(name) == "k"     ? &p.k
                       : std::string(name) == "v"     ? &p.v
                       : std::string(name) == "state" ? &p.state
                                                      : &p.out;
    *view = TensorView();
    expect_error(p, {std::string("'") + name + "'", "required"});
  }
}

TEST(GdnDecodeValidation, RankShapeDtypeAndStrides) {
  {
    BrokenCall call;
    call.params.q.ndim = 3;
    expect_error(call.params, {"'q'", "rank 4", "got rank 3"});
  }
  {
    BrokenCall call;
    call.params.k.shape[3] = 8;
    expect_error(call.params, {"'k'", "[B, T, H, K]", "[3, 2, 2, 16]", "[3, 2, 2, 8]"});
  }
  {
    BrokenCall call;
    call.params.v.shape[1] = 1;
    expect_error(call.params, {"'v'", "[B, T, HV, V]"});
  }
  {
    BrokenCall call;
    call.params.v.dtype = DType::kFloat16;
    expect_error(call.params, {"'v'", "dtype of 'q'", "bfloat16", "float16"});
  }
  {
    BrokenCall call;
    call.params.q.dtype = call.params.k.dtype = call.params.v.dtype = DType::kInt32;
    expect_error(call.params, {"'q'", "bfloat16 or float16 or float32", "int32"});
  }
  {
    BrokenCall call;
    call.params.q.strides[3] = 2;
    expect_error(call.params, {"'q'", "contiguous in its last dimension"});
  }
  {
    BrokenCall call;
    call.params.out.shape[2] = 2;
    expect_error(call.params, {"'out'", "[B, T, HV, V]"});
  }
  {
    BrokenCall call;
    call.params.out.dtype = DType::kInt64;
    expect_error(call.params, {"'out'", "int64"});
  }
}

TEST(GdnDecodeValidation, HeadsMustGroup) {
  GdnCaseConfig c = BrokenCall::default_config();
  c.H = 3;
  c.HV = 4;
  BrokenCall call(c);
  expect_error(call.params, {"HV (4", "multiple", "H (3"});
}

TEST(GdnDecodeValidation, GatingSets) {
  {
    BrokenCall call;  // both sets
    call.params.g = call.params.a;
    call.params.g.dtype = DType::kFloat32;
    expect_error(call.params, {"exactly one gating set"});
  }
  {
    BrokenCall call;  // neither
    call.params.A_log = call.params.a = call.params.dt_bias = call.params.b = TensorView();
    expect_error(call.params, {"no gating given"});
  }
  {
    BrokenCall call;  // incomplete fused set
    call.params.b = TensorView();
    expect_error(call.params, {"'b'", "required", "fused gating"});
  }
  {
    BrokenCall call;
    call.params.A_log.dtype = DType::kBFloat16;
    expect_error(call.params, {"'A_log'", "float32"});
  }
  {
    BrokenCall call;
    call.params.dt_bias.shape[0] = 3;
    expect_error(call.params, {"'dt_bias'", "[HV]"});
  }
  {
    BrokenCall call;
    call.params.a.shape[2] = 2;
    expect_error(call.params, {"'a'", "[B, T, HV]"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.fused_gating = false;
    BrokenCall call(c);
    call.params.beta = TensorView();
    expect_error(call.params, {"'beta'", "required", "precomputed"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.fused_gating = false;
    BrokenCall call(c);
    call.params.g.dtype = DType::kBFloat16;
    expect_error(call.params, {"'g'", "float32", "bfloat16"});
  }
}

TEST(GdnDecodeValidation, StatePool) {
  {
    BrokenCall call;
    call.params.state.dtype = DType::kFloat16;
    expect_error(call.params, {"'state'", "float32 or bfloat16", "float16"});
  }
  {
    BrokenCall call;  // K and V swapped for layout kVK
    std::swap(call.params.state.shape[2], call.params.state.shape[3]);
    expect_error(call.params, {"'state'", "[P, HV, V, K]"});
  }
  {
    BrokenCall call;
    call.params.layout = gdn::StateLayout::kKV;
    expect_error(call.params, {"'state'", "[P, HV, K, V] (layout kKV)"});
  }
  {
    BrokenCall call;  // heads not contiguous inside a slot
    call.params.state.strides[1] *= 2;
    call.params.state.strides[0] *= 2;
    expect_error(call.params, {"'state'", "contiguously"});
  }
  {
    BrokenCall call;  // slots overlapping
    call.params.state.strides[0] = 16;
    expect_error(call.params, {"'state'", "slot pitch", "overlap"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.indices = IndexKind::kNone;
    BrokenCall call(c);
    call.params.state.shape[0] = 2;  // B = 3 requests need 3 slots without indices
    expect_error(call.params, {"'state'", "at least B = 3 slots", "got 2"});
  }
}

TEST(GdnDecodeValidation, IndexTensors) {
  {
    BrokenCall call;
    call.params.state_indices.dtype = DType::kFloat32;
    expect_error(call.params, {"'state_indices'", "int32 or int64", "float32"});
  }
  {
    BrokenCall call;
    call.params.state_indices.shape[0] = 4;
    expect_error(call.params, {"'state_indices'", "[B]"});
  }
  {
    BrokenCall call;
    call.params.state_indices.ndim = 3;
    expect_error(call.params, {"'state_indices'", "rank 1 or 2"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.indices = IndexKind::kPerToken;
    BrokenCall call(c);
    call.params.state_indices.shape[1] = 1;  // C = 1 < T = 2
    expect_error(call.params, {"'state_indices'", "C >= T = 2"});
  }
  {
    BrokenCall call;
    call.params.num_accepted_tokens = call.params.state_indices;
    expect_error(call.params, {"'num_accepted_tokens'", "2-D state_indices"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.indices = IndexKind::kPerToken;
    c.split_pool = true;
    BrokenCall call(c);
    expect_error(call.params, {"'output_state_indices'", "must not be given", "2-D"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.split_pool = true;
    BrokenCall call(c);
    call.params.output_state_indices.dtype = DType::kUInt8;
    expect_error(call.params, {"'output_state_indices'", "uint8"});
  }
  {
    BrokenCall call;
    call.params.invalid_index_count.shape[0] = 2;
    expect_error(call.params, {"'invalid_index_count'", "[1]"});
  }
  {
    BrokenCall call;
    call.params.nonfinite_head_count.shape[0] = 2;
    expect_error(call.params, {"'nonfinite_head_count'", "[1]"});
  }
  {
    BrokenCall call;
    call.params.nonfinite_head_count.dtype = DType::kFloat32;
    expect_error(call.params, {"'nonfinite_head_count'", "float32"});
  }
  {
    BrokenCall call;  // a counter is an output: it must not overlap an input
    call.params.nonfinite_head_count.data = call.params.q.data;
    expect_error(call.params, {"'nonfinite_head_count'", "overlaps 'q'"});
  }
}

TEST(GdnDecodeValidation, IntermediateStates) {
  GdnCaseConfig c = BrokenCall::default_config();
  c.intermediate = true;
  {
    BrokenCall call(c);
    call.params.intermediate_states.dtype = DType::kBFloat16;
    expect_error(call.params, {"'intermediate_states'", "dtype of 'state'"});
  }
  {
    BrokenCall call(c);
    call.params.intermediate_states.shape[1] = 1;
    expect_error(call.params, {"'intermediate_states'", "C >= T = 2"});
  }
  {
    BrokenCall call(c);
    call.params.intermediate_states.shape[0] = 2;
    expect_error(call.params, {"'intermediate_states'", "[B, C, HV, V, K]"});
  }
}

TEST(GdnDecodeValidation, VariableLength) {
  GdnCaseConfig c = BrokenCall::default_config();
  c.varlen_lengths = {1, 2, 1};
  {
    BrokenCall call(c);
    EXPECT_NO_THROW(gdn::decode(call.params));
  }
  {
    BrokenCall call(c);
    call.params.q.shape[0] = 2;
    expect_error(call.params, {"cu_seqlens", "'q'", "[1, total_tokens, H, K]"});
  }
  {
    BrokenCall call(c);
    call.params.cu_seqlens.dtype = DType::kFloat32;
    expect_error(call.params, {"'cu_seqlens'", "int32 or int64"});
  }
  {
    BrokenCall call(c);  // cu_seqlens says 2 requests, state_indices 3
    call.params.cu_seqlens.shape[0] = 3;
    expect_error(call.params, {"'state_indices'", "[B] = [2]"});
  }
}

TEST(GdnDecodeValidation, MaxTokensPerRequest) {
  {
    BrokenCall call;  // T = 2 fixed-length requests cannot be bounded by 1
    call.params.max_tokens_per_request = 1;
    expect_error(call.params, {"'max_tokens_per_request'", "T = 2"});
  }
  {
    BrokenCall call;
    call.params.max_tokens_per_request = -1;
    expect_error(call.params, {"'max_tokens_per_request'", ">= 0"});
  }
  {
    BrokenCall call;
    call.params.max_tokens_per_request = 2;
    EXPECT_NO_THROW(gdn::decode(call.params));
  }
}

TEST(GdnDecodeValidation, Options) {
  {
    BrokenCall call;
    call.params.scale = std::nanf("");
    expect_error(call.params, {"'scale'", "finite"});
  }
  {
    BrokenCall call;
    call.params.softplus_beta = 0.0f;
    expect_error(call.params, {"'softplus_beta'", "> 0"});
  }
  {
    BrokenCall call;
    call.params.l2norm_eps = -1.0f;
    expect_error(call.params, {"'l2norm_eps'", ">= 0"});
  }
}

TEST(GdnDecodeValidation, DevicesAndPointers) {
  {
    BrokenCall call;
    call.params.v.device = Device::cuda(0);
    expect_error(call.params, {"'v'", "cuda:0", "cpu", "one device"});
  }
  {
    BrokenCall call;  // the odd one out is named, even when it leads the argument list
    call.params.q.device = Device::cuda(0);
    expect_error(call.params, {"argument 'q' is on cuda:0 but k, v, A_log", "are on cpu"});
  }
  {
    BrokenCall call;  // a CPU out among CUDA tensors
    for (TensorView* view :
         {&call.params.q, &call.params.k, &call.params.v, &call.params.A_log, &call.params.a,
          &call.params.dt_bias, &call.params.b, &call.params.state, &call.params.state_indices,
          &call.params.invalid_index_count}) {
      view->device = Device::cuda(1);
    }
    expect_error(call.params, {"argument 'out' is on cpu but q, k, v", "are on cuda:1"});
  }
  {
    BrokenCall call;
    call.params.k.data = nullptr;
    expect_error(call.params, {"'k'", "null data pointer"});
  }
  if (!built_with_cuda()) {
    BrokenCall call;
    for (TensorView* view :
         {&call.params.q, &call.params.k, &call.params.v, &call.params.A_log, &call.params.a,
          &call.params.dt_bias, &call.params.b, &call.params.state, &call.params.state_indices,
          &call.params.out, &call.params.invalid_index_count, &call.params.nonfinite_head_count}) {
      view->device = Device::cuda(0);
    }
    expect_error(call.params, {"no CUDA backend"});
  }
}

TEST(GdnDecodeValidation, Aliasing) {
  {
    BrokenCall call;  // out written over q
    call.params.out.data = call.params.q.data;
    expect_error(call.params, {"'out'", "overlaps 'q'"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.intermediate = true;
    BrokenCall call(c);
    call.params.intermediate_states.data = call.params.state.data;
    expect_error(call.params, {"'intermediate_states'", "overlaps", "'state'"});
  }
  {
    BrokenCall call;  // the pool over the indices
    call.params.state_indices.data = call.params.state.data;
    expect_error(call.params, {"'state'", "overlaps 'state_indices'"});
  }
}

// Outputs whose indices share an element would let requests overwrite each other.
TEST(GdnDecodeValidation, SelfOverlappingOutputs) {
  {
    BrokenCall call;  // torch.empty(1, 1, 1, V).expand(B, T, HV, V)
    TensorView& out = call.params.out;
    out.strides[0] = out.strides[1] = out.strides[2] = 0;
    expect_error(call.params, {"'out'", "stride 0 in dim 0", "extent 3"});
  }
  {
    BrokenCall call;  // heads one element apart: head h's row overlaps head h + 1's
    TensorView& out = call.params.out;
    out.strides[2] = 1;
    expect_error(call.params, {"'out'", "may reach one element"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.intermediate = true;
    BrokenCall call(c);  // every token's state in one place
    call.params.intermediate_states.strides[1] = 0;
    expect_error(call.params, {"'intermediate_states'", "stride 0 in dim 1"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.T = 1;
    BrokenCall call(c);  // a dim of extent 1 may have any stride
    call.params.out.strides[1] = 0;
    EXPECT_NO_THROW(gdn::decode(call.params));
  }
}

TEST(GdnDecodeValidation, CheckIndicesOption) {
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.invalid_rows = 1;
    BrokenCall call(c);
    call.params.check_indices = true;
    expect_error(call.params, {"check_indices", "cannot be honoured", "pool size P"});
    call.params.check_indices = false;
    EXPECT_NO_THROW(gdn::decode(call.params));  // counted instead
  }
  {
    BrokenCall call;  // two requests reading and writing one slot
    auto* indices = static_cast<int32_t*>(call.buffer("state_indices"));
    indices[1] = indices[0];
    call.params.check_indices = true;
    expect_error(call.params, {"check_indices", "is written by request 0 and by request 1"});
  }
  {
    GdnCaseConfig c = BrokenCall::default_config();
    c.split_pool = true;
    BrokenCall call(c);  // request 1 writes the slot request 0 reads
    auto* reads = static_cast<int32_t*>(call.buffer("state_indices"));
    auto* writes = static_cast<int32_t*>(call.buffer("output_state_indices"));
    writes[1] = reads[0];
    call.params.check_indices = true;
    expect_error(call.params, {"check_indices", "written by request 1 and read by request 0"});
  }
  {
    BrokenCall call;  // valid indices pass the check
    call.params.check_indices = true;
    EXPECT_NO_THROW(gdn::decode(call.params));
  }
}

TEST(GdnDecodeValidation, TensorViewFactories) {
  float data[4];
  EXPECT_THROW(TensorView::strided(data, DType::kFloat32, {2, 2}, {1}), Error);
  EXPECT_THROW(TensorView::contiguous(data, DType::kFloat32, {1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(TensorView::contiguous(data, DType::kFloat32, {2, -1}), Error);
}

}  // namespace
}  // namespace testing
}  // namespace hdk
