// Every invalid router call is a clear hdk::Error naming the argument, the expectation and what
// was given: never a crash, never a silent wrong answer. One validation serves every backend, so
// these run on the CPU (a view marked cuda:0 is only inspected, never dereferenced).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hdk/dsv4/router.h"
#include "hdk/error.h"

namespace hdk {
namespace testing {
namespace {

// A valid dense call on host memory (N = 3, E = 8, D = 16, top_k = 2) that a test breaks once.
struct Call {
  static constexpr int64_t N = 3, E = 8, D = 16, K = 2, V = 10;
  std::vector<float> logits = std::vector<float>(N * E, 0.5f);
  std::vector<uint16_t> hidden = std::vector<uint16_t>(N * D, 0x3f80);
  std::vector<uint16_t> gate = std::vector<uint16_t>(E * D, 0x3f80);
  std::vector<float> bias = std::vector<float>(E, 0.0f);
  std::vector<int32_t> tokens = std::vector<int32_t>(N, 1);
  std::vector<int32_t> table = std::vector<int32_t>(V * K, 0);
  std::vector<int32_t> ids = std::vector<int32_t>(N * K);
  std::vector<float> weights = std::vector<float>(N * K);
  std::vector<float> workspace = std::vector<float>(16 * N * E);
  int64_t counter = 0;
  dsv4::RouterParams p;

  Call() {
    p.logits = TensorView::contiguous(logits.data(), DType::kFloat32, {N, E});
    p.bias = TensorView::contiguous(bias.data(), DType::kFloat32, {E});
    p.topk_ids = TensorView::contiguous(ids.data(), DType::kInt32, {N, K});
    p.topk_weights = TensorView::contiguous(weights.data(), DType::kFloat32, {N, K});
    p.invalid_count = TensorView::contiguous(&counter, DType::kInt64, {1});
    p.top_k = K;
  }

  void use_fused() {
    p.logits = TensorView();
    p.hidden = TensorView::contiguous(hidden.data(), DType::kBFloat16, {N, D});
    p.gate_weight = TensorView::contiguous(gate.data(), DType::kBFloat16, {E, D});
    p.logits_workspace = TensorView::contiguous(workspace.data(), DType::kFloat32, {16, N, E});
  }

  void use_hash() {
    p.bias = TensorView();
    p.token_ids = TensorView::contiguous(tokens.data(), DType::kInt32, {N});
    p.tid2eid = TensorView::contiguous(table.data(), DType::kInt32, {V, K});
  }
};

void expect_error(const dsv4::RouterParams& p, const std::vector<std::string>& fragments) {
  try {
    dsv4::route(p);
    ADD_FAILURE() << "no hdk::Error thrown; expected one mentioning '" << fragments.front() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("hdk::dsv4::route"), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    }
  }
}

TEST(RouterValidation, ValidCallsPass) {
  Call dense;
  EXPECT_NO_THROW(dsv4::route(dense.p));
  Call fused;
  fused.use_fused();
  EXPECT_NO_THROW(dsv4::route(fused.p));
  Call hash;
  hash.use_hash();
  EXPECT_NO_THROW(dsv4::route(hash.p));
}

TEST(RouterValidation, Outputs) {
  {
    Call call;
    call.p.topk_ids = TensorView();
    expect_error(call.p, {"'topk_ids'", "required"});
  }
  {
    Call call;
    call.p.topk_weights = TensorView();
    expect_error(call.p, {"'topk_weights'", "required"});
  }
  {
    Call call;
    call.p.topk_ids.dtype = DType::kInt64;
    expect_error(call.p, {"'topk_ids'", "int32", "int64"});
  }
  {
    Call call;
    call.p.topk_weights.shape[1] = 3;
    expect_error(call.p, {"'topk_weights'", "[N, top_k] = [3, 2]", "got [3, 3]"});
  }
  {
    Call call;
    call.p.topk_ids.strides[1] = 2;
    expect_error(call.p, {"'topk_ids'", "contiguous in its last dimension"});
  }
  {
    Call call;
    call.p.invalid_count.shape[0] = 2;
    expect_error(call.p, {"'invalid_count'", "[1]", "[2]"});
  }
  {
    Call call;
    call.p.invalid_count.dtype = DType::kFloat32;
    expect_error(call.p, {"'invalid_count'", "int32 or int64", "float32"});
  }
}

TEST(RouterValidation, Scores) {
  {
    Call call;
    call.p.logits = TensorView();
    expect_error(call.p, {"no scores given", "'logits'", "'hidden'", "'gate_weight'"});
  }
  {
    Call call;
    call.use_fused();
    call.p.logits = TensorView::contiguous(call.logits.data(), DType::kFloat32, {Call::N, Call::E});
    expect_error(call.p, {"either 'logits' or 'hidden'", "not both"});
  }
  {
    Call call;
    call.p.logits.dtype = DType::kFloat16;
    expect_error(call.p, {"'logits'", "float32 or bfloat16", "float16"});
  }
  {
    Call call;
    call.p.logits.ndim = 3;
    call.p.logits.shape[2] = 1;
    expect_error(call.p, {"'logits'", "rank 2", "[N, E]"});
  }
  {
    Call call;
    call.use_fused();
    call.p.gate_weight = TensorView();
    expect_error(call.p, {"'gate_weight'", "required", "fused gate"});
  }
  {
    Call call;
    call.use_fused();
    call.p.gate_weight.shape[1] = Call::D - 8;
    expect_error(call.p, {"'gate_weight'", "[E, D] = [8, 16]", "got [8, 8]"});
  }
  {
    Call call;
    call.use_fused();
    call.p.hidden.dtype = DType::kFloat32;
    expect_error(call.p, {"'hidden'", "bfloat16", "float32"});
  }
  {
    Call call;
    call.use_fused();
    call.p.gate_weight.dtype = DType::kFloat16;
    expect_error(call.p, {"'gate_weight'", "bfloat16", "float16"});
  }
  {
    Call call;
    call.use_fused();
    call.p.logits_workspace.shape[2] = 4;
    expect_error(call.p, {"'logits_workspace'", "[S, N, E] = [16, 3, 8]", "got [16, 3, 4]"});
  }
  {
    Call call;  // one slab short of route_workspace_slabs(N)
    call.use_fused();
    call.p.logits_workspace.shape[0] = 15;
    expect_error(call.p, {"'logits_workspace'", "route_workspace_slabs(N)", "got [15, 3, 8]"});
  }
  {
    Call call;  // the [N, E] workspace of earlier versions
    call.use_fused();
    call.p.logits_workspace =
        TensorView::contiguous(call.workspace.data(), DType::kFloat32, {Call::N, Call::E});
    expect_error(call.p, {"'logits_workspace'", "[S, N, E] = [16, 3, 8]", "got [3, 8]"});
  }
  {
    Call call;  // workspace without a GEMM to fill it
    call.p.logits_workspace =
        TensorView::contiguous(call.workspace.data(), DType::kFloat32, {Call::N, Call::E});
    expect_error(call.p, {"'logits_workspace'", "only for the fused gate"});
  }
  {
    Call call;  // CUDA fused path without the workspace: a named error, not an allocation
    call.use_fused();
    call.p.logits_workspace = TensorView();
    for (TensorView* view : {&call.p.hidden, &call.p.gate_weight, &call.p.bias, &call.p.topk_ids,
                             &call.p.topk_weights, &call.p.invalid_count}) {
      view->device = Device::cuda(0);
    }
    expect_error(call.p, {"'logits_workspace'", "[S, N, E] = [16, 3, 8]", "required", "cuda:0",
                          "allocates nothing"});
  }
}

// The workspace's slab count depends on N alone: 16 up to 64 rows, then fewer, so that the
// workspace never exceeds max(1024, N) * E floats.
TEST(RouterValidation, WorkspaceSlabs) {
  const int64_t rows[] = {0, 1, 64, 65, 128, 129, 256, 1024, 1025, 100000};
  const int64_t slabs[] = {16, 16, 16, 8, 8, 5, 4, 1, 1, 1};
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i) {
    EXPECT_EQ(dsv4::route_workspace_slabs(rows[i]), slabs[i]) << "N = " << rows[i];
    EXPECT_LE(dsv4::route_workspace_slabs(rows[i]) * rows[i], std::max<int64_t>(1024, rows[i]));
  }
}

TEST(RouterValidation, Options) {
  {
    Call call;
    call.p.top_k = 0;
    expect_error(call.p, {"'top_k'", "at least 1", "got 0"});
  }
  {
    Call call;
    call.p.top_k = 9;
    expect_error(call.p, {"'top_k'", "at most E = 8", "got 9"});
  }
  {
    Call call;  // k > 2048 is an error before the output shapes are looked at
    call.p.top_k = 2049;
    expect_error(call.p, {"'top_k'", "at most 2048", "got 2049"});
  }
  {
    Call call;
    call.p.route_scale = std::numeric_limits<float>::quiet_NaN();
    expect_error(call.p, {"'route_scale'", "finite"});
  }
  {
    Call call;
    call.p.bias.shape[0] = 7;
    expect_error(call.p, {"'bias'", "[E] = [8]", "got [7]"});
  }
  {
    Call call;
    call.p.bias.dtype = DType::kBFloat16;
    expect_error(call.p, {"'bias'", "float32", "bfloat16"});
  }
}

TEST(RouterValidation, HashRouting) {
  {
    Call call;
    call.use_hash();
    call.p.tid2eid = TensorView();
    expect_error(call.p, {"'tid2eid'", "required", "hash routing"});
  }
  {
    Call call;
    call.use_hash();
    call.p.bias = TensorView::contiguous(call.bias.data(), DType::kFloat32, {Call::E});
    expect_error(call.p, {"'bias'", "must not be given", "hash routing"});
  }
  {
    Call call;
    call.use_hash();
    call.p.tid2eid.shape[1] = 3;
    expect_error(call.p, {"'tid2eid'", "[vocab, top_k] = [10, 2]", "got [10, 3]"});
  }
  {
    Call call;
    call.use_hash();
    call.p.tid2eid.dtype = DType::kInt64;
    expect_error(call.p, {"'tid2eid'", "int32", "int64"});
  }
  {
    Call call;
    call.use_hash();
    call.p.token_ids.shape[0] = 2;
    expect_error(call.p, {"'token_ids'", "[N] = [3]", "got [2]"});
  }
  {
    Call call;
    call.use_hash();
    call.p.token_ids.dtype = DType::kFloat32;
    expect_error(call.p, {"'token_ids'", "int32 or int64", "float32"});
  }
}

TEST(RouterValidation, DevicesAndAliasing) {
  {
    Call call;
    call.p.bias.device = Device::cuda(0);
    expect_error(call.p, {"'bias'", "cuda:0", "one device"});
  }
  {
    Call call;  // the odd one out is named with the tensors on the device most are on
    call.p.topk_ids.device = Device::cuda(0);
    expect_error(call.p, {"argument 'topk_ids' is on cuda:0 but logits, bias, topk_weights, "
                          "invalid_count are on cpu"});
  }
  {
    Call call;  // rows of the outputs in one place: tokens would overwrite each other
    call.p.topk_weights.strides[0] = 0;
    expect_error(call.p, {"'topk_weights'", "stride 0 in dim 0"});
  }
  {
    Call call;
    call.use_fused();
    call.p.logits_workspace.strides[0] = 0;
    expect_error(call.p, {"'logits_workspace'", "stride 0 in dim 0"});
  }
  {
    Call call;
    call.p.topk_weights.data = call.logits.data();
    expect_error(call.p, {"'topk_weights'", "overlaps 'logits'"});
  }
  {
    Call call;
    call.p.invalid_count.data = call.ids.data();
    expect_error(call.p, {"overlaps", "'invalid_count'"});
  }
  {
    Call call;
    call.use_fused();
    // The gate inside the workspace's own allocation: a workspace pointed at the gate would run
    // past it into whatever the heap put next (on one machine the top-k weights), and the
    // check would name that overlap instead.
    call.p.gate_weight.data = call.workspace.data() + 64;
    expect_error(call.p, {"'logits_workspace'", "overlaps 'gate_weight'"});
  }
  {
    Call call;
    call.p.logits.data = nullptr;
    expect_error(call.p, {"'logits'", "null data pointer"});
  }
}

}  // namespace
}  // namespace testing
}  // namespace hdk
