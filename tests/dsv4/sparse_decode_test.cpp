// sparse_decode (the CPU backend and the three CUDA kernels, each forced in turn; CUDA cases skip
// only without a GPU) against the float64 reference, on random entries written by the write
// side's store_entries into shuffled pages, with poisoned outputs and counters that start at 3.
//
// Tolerances, and why: fp32 scores (512-term dot products) and fp32 online softmax, then the
// output rounded once to bf16 (2^-8 relative) or fp32. |o - ref| <= 2^-8 |ref| (bf16; 2^-22 for
//   fp32) + 1e-4 x (1 + max score magnitude) x max |E|: a score error of e moves every weight by
//   a factor of about 1 + e; |lse - ref| <= 1e-4 x (1 + max score magnitude). The CUDA
//   tensor-core kernel rounds the softmax weights to bf16 for its P E product (|o| moves by at
//   most 2^-9 x max |E|: the weights are a convex combination, each off by 2^-9 relative) and fp32
//   queries to bf16 (scores move by at most 2^-9 x S); its bounds add 2^-8 x max |E| to the
//   absolute term and, for fp32 queries, 2^-8 x S to the score term. The CUDA-core kernel keeps
//   the CPU's fp32 arithmetic and its bounds. Both tensor-core kernels (pipelined and not) round
//   the same way and share these bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/float_convert.h"
#include "dsv4/attention/reference/attention_reference.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "support/device_memory.h"
#include "support/expect_error.h"
#include "support/kv_cache_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "dsv4/attention/attention_validation.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_cuda.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#endif

namespace hdk {
namespace testing {
namespace {

using dsv4::KeyFormat;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

float read_float(const std::vector<uint8_t>& bytes, DType dtype, size_t index) {
  if (dtype == DType::kBFloat16) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * index, 2);
    return hdk::detail::bf16_to_float(bits);
  }
  float value;
  std::memcpy(&value, bytes.data() + 4 * index, 4);
  return value;
}

struct SparseCase {
  int64_t N = 2;
  int64_t heads = 64;
  int64_t L = 640;
  int64_t block_size = 64;
  int64_t num_blocks = 8;
  DType q_dtype = DType::kBFloat16;
  DType out_dtype = DType::kBFloat16;
  DType index_dtype = DType::kInt32;
  bool sink = true;
  bool lse = true;
  bool lse_includes_sink = true;
  float scale = 0.0f;
  float q_scale = 1.0f;
  // Each entry's values times 2^e, e drawn from 0 .. entry_exponent_spread: scale bytes beyond
  // 2^7 take the CUDA kernels' second dequantization path.
  int entry_exponent_spread = 0;
  std::vector<int64_t> empty_rows;  // rows whose list is all negative
  uint64_t seed = 1;
  // The optional second list (extra_L > 0): extra_L slots per row over a second cache of
  // extra_num_blocks pages of extra_block_size entries, like SWA rings kept apart.
  int64_t extra_L = 0;
  int64_t extra_block_size = 128;
  int64_t extra_num_blocks = 3;
  // q and out start one element into their buffers: the CUDA kernels' paths for rows that are
  // not 16-byte aligned (element loads and stores instead of vectors and cp.async).
  bool misaligned = false;

  int64_t q_pad_bytes() const { return misaligned ? dtype_size(q_dtype) : 0; }
  int64_t out_pad() const { return misaligned ? 1 : 0; }

  std::string describe() const {
    return "N=" + std::to_string(N) + " H=" + std::to_string(heads) + " L=" + std::to_string(L) +
           " bs=" + std::to_string(block_size) + " blocks=" + std::to_string(num_blocks) + " " +
           dtype_name(q_dtype) + "->" + dtype_name(out_dtype) + (sink ? " sink" : "") +
           (misaligned ? " misaligned" : "") + " scale=" + std::to_string(scale) +
           (entry_exponent_spread > 0 ? " entries x 2^0.." + std::to_string(entry_exponent_spread)
                                      : "") +
           " seed=" + std::to_string(seed) +
           (extra_L > 0
                ? " extra L2=" + std::to_string(extra_L) + " bs=" + std::to_string(extra_block_size)
                : "");
  }
};

struct SparseInputs {
  std::vector<float> q, sink;
  std::vector<uint8_t> q_bytes, cache, indices, out;
  std::vector<int64_t> slots;
  std::vector<uint8_t> extra_cache, extra_indices;
  std::vector<int64_t> extra_slots;
  std::vector<float> lse;
  std::vector<uint8_t> counter = counter_bytes(DType::kInt64, 3);

  dsv4::SparseDecodeParams params(const SparseCase& c) {
    dsv4::SparseDecodeParams p;
    p.q = TensorView::contiguous(q_bytes.data() + c.q_pad_bytes(), c.q_dtype,
                                 {c.N, c.heads, dsv4::kHeadDim});
    p.cache = TensorView::contiguous(cache.data(), DType::kUInt8,
                                     {c.num_blocks, c.block_size * dsv4::kEntryBytes});
    p.block_size = c.block_size;
    p.indices = TensorView::contiguous(indices.data(), c.index_dtype, {c.N, c.L});
    if (c.extra_L > 0) {
      p.extra_cache =
          TensorView::contiguous(extra_cache.data(), DType::kUInt8,
                                 {c.extra_num_blocks, c.extra_block_size * dsv4::kEntryBytes});
      p.extra_block_size = c.extra_block_size;
      p.extra_indices =
          TensorView::contiguous(extra_indices.data(), c.index_dtype, {c.N, c.extra_L});
    }
    if (c.sink) p.sink = TensorView::contiguous(sink.data(), DType::kFloat32, {c.heads});
    p.scale = c.scale;
    p.out = TensorView::contiguous(out.data() + c.out_pad() * dtype_size(c.out_dtype), c.out_dtype,
                                   {c.N, c.heads, dsv4::kHeadDim});
    if (c.lse) p.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {c.N, c.heads});
    p.lse_includes_sink = c.lse_includes_sink;
    p.invalid_count = TensorView::contiguous(counter.data(), DType::kInt64, {});
    return p;
  }
};

// Writes `values` ([rows, 512]) to `slots` of a cache of num_blocks pages of block_size entries
// with store_entries.
void store_rows(std::vector<uint8_t>& cache, int64_t num_blocks, int64_t block_size,
                std::vector<float> values, const std::vector<int64_t>& slots) {
  const auto rows = static_cast<int64_t>(slots.size());
  std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt64);
  dsv4::StoreEntriesParams store;
  store.values = TensorView::contiguous(values.data(), DType::kFloat32, {rows, dsv4::kHeadDim});
  store.slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {rows});
  store.cache = TensorView::contiguous(cache.data(), DType::kUInt8,
                                       {num_blocks, block_size * dsv4::kEntryBytes});
  store.block_size = block_size;
  dsv4::store_entries(store);
}

void store_rows(std::vector<uint8_t>& cache, const SparseCase& c, std::vector<float> values,
                const std::vector<int64_t>& slots) {
  store_rows(cache, c.num_blocks, c.block_size, std::move(values), slots);
}

// A cache of num_blocks pages of block_size random entries, and a [N, L] list of random slots of
// it (repeats allowed), about one in eight negative, every one negative in `empty_rows`.
void make_list(std::mt19937_64& rng, const SparseCase& c, int64_t num_blocks, int64_t block_size,
               int64_t L, std::vector<uint8_t>& cache, std::vector<int64_t>& list) {
  const int64_t slots = num_blocks * block_size;
  cache.resize(static_cast<size_t>(num_blocks * block_size * dsv4::kEntryBytes));
  std::vector<int64_t> all(static_cast<size_t>(slots));
  std::iota(all.begin(), all.end(), int64_t{0});
  std::vector<float> values = normal_values(rng, slots * dsv4::kHeadDim, 1.0f);
  if (c.entry_exponent_spread > 0) {
    for (int64_t slot = 0; slot < slots; ++slot) {
      const float factor = std::ldexp(
          1.0f, static_cast<int>(rng() % static_cast<uint64_t>(c.entry_exponent_spread + 1)));
      for (int64_t i = 0; i < dsv4::kHeadDim; ++i)
        values[static_cast<size_t>(slot * dsv4::kHeadDim + i)] *= factor;
    }
  }
  store_rows(cache, num_blocks, block_size, std::move(values), all);
  list.resize(static_cast<size_t>(c.N * L));
  for (int64_t n = 0; n < c.N; ++n) {
    const bool empty = std::find(c.empty_rows.begin(), c.empty_rows.end(), n) != c.empty_rows.end();
    for (int64_t l = 0; l < L; ++l) {
      const bool skip = empty || rng() % 8 == 0;
      list[n * L + l] = skip ? -1 - static_cast<int64_t>(rng() % 3)
                             : static_cast<int64_t>(rng() % static_cast<uint64_t>(slots));
    }
  }
}

// Every slot of the cache (and of the extra cache) holds a random entry; each row's lists name
// random slots of them.
SparseInputs make_sparse_inputs(const SparseCase& c) {
  std::mt19937_64 rng(c.seed);
  SparseInputs in;
  make_list(rng, c, c.num_blocks, c.block_size, c.L, in.cache, in.slots);
  in.indices = index_bytes(in.slots, c.index_dtype);
  if (c.extra_L > 0) {
    make_list(rng, c, c.extra_num_blocks, c.extra_block_size, c.extra_L, in.extra_cache,
              in.extra_slots);
    in.extra_indices = index_bytes(in.extra_slots, c.index_dtype);
  }
  in.q = normal_values(rng, c.N * c.heads * dsv4::kHeadDim, c.q_scale);
  in.q_bytes = encode_rows(in.q, c.q_dtype);
  in.q_bytes.insert(in.q_bytes.begin(), static_cast<size_t>(c.q_pad_bytes()), uint8_t{0});
  in.sink = normal_values(rng, c.heads, 2.0f);
  in.out.resize(static_cast<size_t>((c.N * c.heads * dsv4::kHeadDim + c.out_pad()) *
                                    dtype_size(c.out_dtype)));
  for (auto& byte : in.out)
    byte = 0xff;  // NaN in fp32 and bf16
  in.lse.assign(static_cast<size_t>(c.N * c.heads), 12345.0f);
  return in;
}

// Where a sparse_decode case runs: the CPU, or CUDA with one of its kernels forced.
// kDispatch: CUDA's own choice of kernel and plan (with a workspace: the fewest tiles a CTA and
// smaller head groups where they apply, plan_sparse_fewest_tiles).
enum class SparseKernel { kCpu, kTensorCore, kTensorCorePipelined, kCudaCore, kDispatch };

// Whether `kernel` is a tensor-core kernel forced for every head count (refused where the kernel
// cannot serve them).
bool forces_tensor_cores(SparseKernel kernel) {
  return kernel == SparseKernel::kTensorCore || kernel == SparseKernel::kTensorCorePipelined;
}

// Whether `kernel` may run on tensor cores (bf16 operands: the wider bounds of
// check_sparse_outputs).
bool on_tensor_cores(SparseKernel kernel) {
  return forces_tensor_cores(kernel) || kernel == SparseKernel::kDispatch;
}

// `workspace`: CUDA gets a workspace filled with random bytes and splits every row through it
// wherever the list allows (SparseWorkspaceChoice::kAlways).
struct SparseRun {
  Backend backend = Backend::kCPU;
  SparseKernel kernel = SparseKernel::kCpu;
  bool workspace = false;
};

const char* kernel_name(SparseKernel kernel) {
  switch (kernel) {
    case SparseKernel::kTensorCore:
      return "cuda_tensor_core";
    case SparseKernel::kTensorCorePipelined:
      return "cuda_tensor_core_pipelined";
    case SparseKernel::kCudaCore:
      return "cuda_cuda_core";
    case SparseKernel::kDispatch:
      return "cuda_dispatch";
    case SparseKernel::kCpu:
      break;
  }
  return "cpu";
}

// Whether the tensor-core kernel can be forced for `heads` (sparse_decode_cuda.h).
bool tensor_core_serves(int64_t heads) {
  return heads % 16 == 0 && heads <= 512;
}

// Forces the CUDA kernel of `run` for its lifetime; restored however the call ends, so a
// throwing backend cannot leave later tests on a forced kernel.
class ForcedSparseKernel {
 public:
  explicit ForcedSparseKernel(const SparseRun& run) {
#ifdef HDK_WITH_CUDA
    using dsv4::detail::SparseDecodeKernel;
    dsv4::detail::set_sparse_decode_workspace_override(
        run.workspace ? dsv4::detail::SparseWorkspaceChoice::kAlways
                      : dsv4::detail::SparseWorkspaceChoice::kAuto);
    dsv4::detail::set_sparse_decode_kernel_override(
        run.kernel == SparseKernel::kTensorCore ? SparseDecodeKernel::kTensorCore
        : run.kernel == SparseKernel::kTensorCorePipelined
            ? SparseDecodeKernel::kTensorCorePipelinedEveryCall
        : run.kernel == SparseKernel::kCudaCore ? SparseDecodeKernel::kCudaCore
                                                : SparseDecodeKernel::kAuto);
#else
    (void)run;
#endif
  }
  ~ForcedSparseKernel() {
#ifdef HDK_WITH_CUDA
    dsv4::detail::set_sparse_decode_kernel_override(dsv4::detail::SparseDecodeKernel::kAuto);
    dsv4::detail::set_sparse_decode_workspace_override(dsv4::detail::SparseWorkspaceChoice::kAuto);
#endif
  }
  ForcedSparseKernel(const ForcedSparseKernel&) = delete;
  ForcedSparseKernel& operator=(const ForcedSparseKernel&) = delete;
};

// The workspace sparse_decode asks for `c`'s shape on `device` (at least 256 bytes, so that the
// CPU gets one too and ignores it).
size_t sparse_workspace_size(const SparseCase& c, const Device& device) {
  const int64_t bytes = dsv4::sparse_decode_workspace_bytes(c.N, c.heads, c.L + c.extra_L, device);
  return static_cast<size_t>(std::max<int64_t>(bytes, 256));
}

std::vector<uint8_t> random_bytes(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  std::vector<uint8_t> bytes(count);
  for (auto& byte : bytes)
    byte = static_cast<uint8_t>(rng());
  return bytes;
}

// Runs sparse_decode on `run`'s backend over copies of the host inputs (out, lse and the counter
// poisoned as `in` holds them) and copies out, lse and the counter back into `in`.
void run_sparse_backend(const SparseCase& c, SparseInputs& in, const SparseRun& run,
                        bool check_indices = false) {
  const Device device = backend_device(run.backend);
  dsv4::SparseDecodeParams p = in.params(c);
  p.check_indices = check_indices;
  std::vector<DeviceBuffer> buffers;
  buffers.reserve(9);
  // `host` is the whole buffer; a view that starts inside it keeps its offset on the device.
  auto place = [&](TensorView& view, const void* host, size_t bytes) {
    if (!view.defined()) return;
    const std::ptrdiff_t offset =
        static_cast<const uint8_t*>(view.data) - static_cast<const uint8_t*>(host);
    buffers.emplace_back(run.backend, std::max<size_t>(bytes, 1));
    buffers.back().upload(host, bytes);
    view.data = static_cast<uint8_t*>(buffers.back().data()) + offset;
    view.device = device;
  };
  place(p.q, in.q_bytes.data(), in.q_bytes.size());
  place(p.cache, in.cache.data(), in.cache.size());
  place(p.indices, in.indices.data(), in.indices.size());
  place(p.extra_cache, in.extra_cache.data(), in.extra_cache.size());
  place(p.extra_indices, in.extra_indices.data(), in.extra_indices.size());
  place(p.sink, in.sink.data(), in.sink.size() * sizeof(float));
  place(p.out, in.out.data(), in.out.size());
  place(p.lse, in.lse.data(), in.lse.size() * sizeof(float));
  place(p.invalid_count, in.counter.data(), in.counter.size());
  // Placed last: the fetches below go by the order of the buffers above.
  std::vector<uint8_t> workspace;
  if (run.workspace) {
    const size_t bytes = sparse_workspace_size(c, device);
    workspace = random_bytes(bytes + 256, c.seed);
    if (run.backend == Backend::kCPU) {  // host memory: the view starts on a 256-byte boundary
      uint8_t* aligned =
          workspace.data() + (256 - reinterpret_cast<uintptr_t>(workspace.data()) % 256);
      p.workspace = TensorView::contiguous(aligned, DType::kUInt8, {static_cast<int64_t>(bytes)});
    } else {  // a device allocation starts on one
      p.workspace =
          TensorView::contiguous(workspace.data(), DType::kUInt8, {static_cast<int64_t>(bytes)});
      place(p.workspace, workspace.data(), workspace.size());
    }
  }
  {
    const ForcedSparseKernel forced(run);
    dsv4::sparse_decode(p);
  }
  synchronize(run.backend);
  // The buffers were placed in order; out, lse and the counter come back.
  size_t next = 0;
  auto fetch = [&](const TensorView& view, void* host, size_t bytes) {
    if (!view.defined()) return;
    DeviceBuffer& buffer = buffers[next++];
    if (host != nullptr) buffer.download(host, bytes);
  };
  fetch(p.q, nullptr, 0);
  fetch(p.cache, nullptr, 0);
  fetch(p.indices, nullptr, 0);
  fetch(p.extra_cache, nullptr, 0);
  fetch(p.extra_indices, nullptr, 0);
  fetch(p.sink, nullptr, 0);
  fetch(p.out, in.out.data(), in.out.size());
  fetch(p.lse, in.lse.data(), in.lse.size() * sizeof(float));
  fetch(p.invalid_count, in.counter.data(), in.counter.size());
}

// The bounds of the file comment, widened for the tensor-core kernel by what it rounds: the
// softmax weights to bf16 (|o| moves by at most 2^-9 x max|E|; 2^-8 allowed) and fp32 queries to
// bf16 (scores move by at most 2^-9 x S; 2^-8 allowed).
void check_sparse_outputs(const SparseCase& c, const SparseInputs& in,
                          const dsv4::SparseDecodeReference& ref,
                          SparseKernel kernel = SparseKernel::kCpu) {
  const int64_t D = dsv4::kHeadDim;
  // The dispatcher runs head counts the tensor cores cannot serve on the exact CUDA-core kernel,
  // held to its bounds.
  const bool tensor_core =
      on_tensor_cores(kernel) && (kernel != SparseKernel::kDispatch || tensor_core_serves(c.heads));
  const double relative = c.out_dtype == DType::kBFloat16 ? std::ldexp(1.0, -8) : 1e-6;
  // The element before a misaligned out is not out's: it keeps its poison.
  const auto pad_bytes = static_cast<size_t>(c.out_pad()) * dtype_size(c.out_dtype);
  for (size_t i = 0; i < pad_bytes; ++i) {
    ASSERT_EQ(in.out[i], 0xff) << "byte " << i << " before out was written";
  }
  double worst = 0.0;
  for (int64_t n = 0; n < c.N; ++n) {
    SCOPED_TRACE("row " + std::to_string(n) + (ref.invalid[n] ? " (invalid)" : ""));
    double score_tol = 1e-4 * (1.0 + ref.score_magnitude[n]);
    if (tensor_core && c.q_dtype == DType::kFloat32) {
      score_tol += std::ldexp(1.0, -8) * ref.score_magnitude[n];
    }
    double value_tol = score_tol * ref.value_magnitude[n];
    if (tensor_core) value_tol += std::ldexp(1.0, -8) * ref.value_magnitude[n];
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t i = 0; i < D; ++i) {
        const size_t at = static_cast<size_t>((n * c.heads + h) * D + i);
        const double want = ref.out[at];
        const double got = read_float(in.out, c.out_dtype, at + static_cast<size_t>(c.out_pad()));
        const double tol = relative * std::fabs(want) + value_tol;
        ASSERT_LE(std::fabs(got - want), tol)
            << "head " << h << " value " << i << ": got " << got << ", want " << want;
        if (ref.invalid[n]) {
          ASSERT_EQ(got, 0.0);
        }
        if (value_tol > 0) worst = std::max(worst, std::fabs(got - want) / (tol));
      }
      if (!c.lse) continue;
      const double want = ref.lse[n * c.heads + h];
      const double got = in.lse[n * c.heads + h];
      if (std::isnan(want) || std::isinf(want)) {
        ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : got == want)
            << "lse head " << h << ": got " << got << ", want " << want;
      } else {
        ASSERT_NEAR(got, want, score_tol) << "lse head " << h;
      }
    }
  }
  ::testing::Test::RecordProperty("worst_error_over_tolerance", std::to_string(worst));
}

// The reference's result and counter for the host inputs `in`.
dsv4::SparseDecodeReference sparse_reference(const SparseCase& c, SparseInputs& in) {
  std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt64, 3);
  dsv4::SparseDecodeParams ref_params = in.params(c);
  ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt64, {});
  const dsv4::SparseDecodeReference ref = dsv4::sparse_decode_reference(ref_params);
  EXPECT_EQ(read_counter(ref_counter, DType::kInt64), 3 + ref.invalid_rows);
  return ref;
}

// A forced tensor-core kernel refuses head counts it cannot serve, before writing anything.
bool refused_by_tensor_core(const SparseCase& c, SparseInputs& in, const SparseRun& run) {
  if (!forces_tensor_cores(run.kernel) || tensor_core_serves(c.heads)) return false;
  const std::vector<uint8_t> poisoned = in.out;
  expect_error([&] { run_sparse_backend(c, in, run); }, "the tensor-core kernel was forced");
  EXPECT_EQ(in.out, poisoned);
  return true;
}

void run_sparse_case(const SparseCase& c, const SparseRun& run) {
  SCOPED_TRACE(c.describe() + " on " + kernel_name(run.kernel));
  SparseInputs in = make_sparse_inputs(c);
  const dsv4::SparseDecodeReference ref = sparse_reference(c, in);
  if (refused_by_tensor_core(c, in, run)) return;
  run_sparse_backend(c, in, run);
  EXPECT_EQ(read_counter(in.counter, DType::kInt64), 3 + ref.invalid_rows);
  check_sparse_outputs(c, in, ref, run.kernel);
}

class SparseDecode : public ::testing::TestWithParam<SparseRun> {
 protected:
  void SetUp() override {
    const std::string reason = backend_unavailable_reason(GetParam().backend);
    if (!reason.empty()) {
      GTEST_SKIP() << backend_name(GetParam().backend) << " backend skipped: " << reason;
    }
  }
};

TEST_P(SparseDecode, FlashShapeCsaList) {
  SparseCase c;
  c.N = 3;
  c.L = 128 + 512;
  c.empty_rows = std::vector<int64_t>{1};
  run_sparse_case(c, GetParam());
}

// Through the workspace with bf16 outputs, a lone Flash CSA row (dispatched in four groups of 16
// heads) keeps fp32 records and eight rows take bf16 ones (sparse_bf16_records); fp32 outputs
// keep fp32 records.
TEST_P(SparseDecode, WorkspaceRecordsOfEitherWidth) {
  for (int64_t rows : {1, 8}) {
    for (DType out : {DType::kBFloat16, DType::kFloat32}) {
      SparseCase c;
      c.N = rows;
      c.L = 128 + 512;
      c.out_dtype = out;
      c.seed = 11 + static_cast<uint64_t>(rows);
      run_sparse_case(c, GetParam());
    }
  }
}

TEST_P(SparseDecode, MisalignedQueryAndOutput) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    SparseCase c;
    c.N = 3;
    c.L = 200;
    c.misaligned = true;
    c.q_dtype = dtype;
    c.out_dtype = dtype;
    c.empty_rows = std::vector<int64_t>{2};
    run_sparse_case(c, GetParam());
  }
}

TEST_P(SparseDecode, ProShapeCsaList) {
  SparseCase c;
  c.heads = 128;
  c.L = 128 + 1024;
  c.num_blocks = 20;
  c.q_dtype = DType::kFloat32;
  c.index_dtype = DType::kInt64;
  c.sink = false;
  c.seed = 2;
  run_sparse_case(c, GetParam());
}

// The SWA ring kept in its own tensor (pages of 128) next to the compressed pool (pages of 64),
// as hdk.dsv4.KVCacheManager keeps them.
TEST_P(SparseDecode, ExtraListOverASecondCache) {
  SparseCase c;
  c.N = 3;
  c.L = 512;
  c.extra_L = 128;
  c.empty_rows = std::vector<int64_t>{2};
  run_sparse_case(c, GetParam());
  c.heads = 64;
  c.L = 0;  // only the extra list
  c.extra_L = 9;
  c.extra_block_size = 5;
  c.index_dtype = DType::kInt64;
  c.seed = 4;
  run_sparse_case(c, GetParam());
  c.heads = 7;
  c.L = 70;  // list lengths off the tensor-core tiles on both sides
  c.extra_L = 61;
  c.seed = 5;
  run_sparse_case(c, GetParam());
}

// A list split into indices + extra_indices over two copies of one cache is the one list: the
// result matches the whole list's reference (on the CPU: the same numbers).
TEST_P(SparseDecode, SplitListEqualsTheWholeList) {
  SparseCase whole;
  whole.N = 2;
  whole.heads = 64;
  whole.L = 100;
  whole.out_dtype = DType::kFloat32;
  SparseInputs in = make_sparse_inputs(whole);
  const dsv4::SparseDecodeReference ref = sparse_reference(whole, in);
  if (refused_by_tensor_core(whole, in, GetParam())) return;
  SparseInputs whole_run = in;
  run_sparse_backend(whole, whole_run, GetParam());

  SparseCase split = whole;
  split.L = 37;
  split.extra_L = whole.L - split.L;
  split.extra_num_blocks = whole.num_blocks;
  split.extra_block_size = whole.block_size;
  std::vector<int64_t> first, second;
  for (int64_t n = 0; n < whole.N; ++n) {
    first.insert(first.end(), &in.slots[n * whole.L], &in.slots[n * whole.L + split.L]);
    second.insert(second.end(), &in.slots[n * whole.L + split.L], &in.slots[(n + 1) * whole.L]);
  }
  SparseInputs split_run = in;
  split_run.indices = index_bytes(first, whole.index_dtype);
  split_run.extra_cache = in.cache;
  split_run.extra_indices = index_bytes(second, whole.index_dtype);
  run_sparse_backend(split, split_run, GetParam());
  check_sparse_outputs(whole, split_run, ref, GetParam().kernel);
  if (GetParam().backend == Backend::kCPU) {
    for (size_t i = 0; i < in.lse.size(); ++i)
      ASSERT_NEAR(split_run.lse[i], whole_run.lse[i], 1e-5) << i;
    for (size_t i = 0; i < in.out.size() / 4; ++i) {
      ASSERT_NEAR(read_float(split_run.out, DType::kFloat32, i),
                  read_float(whole_run.out, DType::kFloat32, i), 1e-5)
          << i;
    }
  }
}

// Entries up to 2^24 times larger than the others: scale bytes up to about 144, above the
// one-multiply dequantization's 134, in the same tiles as small ones.
TEST_P(SparseDecode, LargeEntryScales) {
  SparseCase c;
  c.N = 3;
  c.L = 300;
  c.entry_exponent_spread = 24;
  c.q_scale = std::ldexp(1.0f, -22);
  run_sparse_case(c, GetParam());
}

// FlashMLA's convention: the sink scales o but is left out of lse (-inf for an empty list).
TEST_P(SparseDecode, LseWithoutTheSink) {
  SparseCase c;
  c.N = 3;
  c.heads = 16;
  c.L = 50;
  c.out_dtype = DType::kFloat32;
  c.empty_rows = std::vector<int64_t>{1};
  c.lse_includes_sink = false;
  run_sparse_case(c, GetParam());

  SparseInputs in = make_sparse_inputs(c);
  SparseInputs without = in;
  run_sparse_backend(c, without, GetParam());
  c.lse_includes_sink = true;
  run_sparse_backend(c, in, GetParam());
  EXPECT_EQ(in.out, without.out);  // o does not depend on the option
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t h = 0; h < c.heads; ++h) {
      const float lse_without = without.lse[n * c.heads + h], with = in.lse[n * c.heads + h];
      if (n == 1) {
        EXPECT_EQ(lse_without, -kInf);
        EXPECT_EQ(with, in.sink[h]);
        continue;
      }
      // e^with = e^without + e^sink
      const double expected = std::log(std::exp(static_cast<double>(lse_without)) +
                                       std::exp(static_cast<double>(in.sink[h])));
      EXPECT_NEAR(with, expected, 1e-5 * (1.0 + std::fabs(expected))) << n << " " << h;
    }
  }
}

TEST_P(SparseDecode, LongList) {
  SparseCase c;
  c.N = 1;
  c.L = 2048 + 128;
  c.num_blocks = 40;
  c.out_dtype = DType::kFloat32;
  c.q_scale = 3.0f;  // sharper softmax
  c.seed = 3;
  run_sparse_case(c, GetParam());
}

// The longest lists of the issue (128 + 4096) with Pro's heads: on CUDA the most splits a cluster
// holds (2 head groups x 4 list slices at N = 2), and a list far longer still.
TEST_P(SparseDecode, LongestListsProHeads) {
  SparseCase c;
  c.N = 2;
  c.heads = 128;
  c.L = 128 + 4096;
  c.num_blocks = 80;
  c.seed = 4;
  run_sparse_case(c, GetParam());
  c.N = 1;
  c.heads = 64;
  c.L = 20000;
  c.block_size = 128;
  c.num_blocks = 50;
  c.out_dtype = DType::kFloat32;
  c.seed = 5;
  run_sparse_case(c, GetParam());
}

// Forces the tensor-core kernels' list splits for its lifetime (0 = the plan's), restored
// however the test ends.
class ForcedSplits {
 public:
  explicit ForcedSplits(int splits) {
#ifdef HDK_WITH_CUDA
    dsv4::detail::set_sparse_decode_splits_override(splits);
#else
    (void)splits;
#endif
  }
  ~ForcedSplits() {
#ifdef HDK_WITH_CUDA
    dsv4::detail::set_sparse_decode_splits_override(0);
#endif
  }
  ForcedSplits(const ForcedSplits&) = delete;
  ForcedSplits& operator=(const ForcedSplits&) = delete;
};

// Every list split count a cluster holds, powers of two or not (a split of S finishes columns
// [512 s / S, 512 (s + 1) / S) of the combine, slices of 43 column quads and of 42 at S = 3),
// with Flash's and Pro's heads; 18 tiles, so up to 16 splits keep a tile each. The CPU has no
// splits and runs each shape once.
TEST_P(SparseDecode, EverySplitCount) {
  const bool cpu = GetParam().backend == Backend::kCPU;
  uint64_t seed = 300;
  for (int64_t heads : {64, 128}) {
    for (int splits : {1, 2, 3, 5, 6, 7, 8, 11, 16}) {
      if (cpu && splits > 1) break;
      SparseCase c;
      c.N = 3;
      c.heads = heads;
      c.L = 1000;
      c.extra_L = 128;
      c.num_blocks = 20;
      c.empty_rows = std::vector<int64_t>{2};
      c.seed = seed++;
      ForcedSplits forced(splits);
#ifdef HDK_WITH_CUDA
      if (!cpu) {
        // The split count the launch takes: the one forced, within the cluster limit.
        SparseInputs shape = make_sparse_inputs(c);
        const ForcedSparseKernel kernel(GetParam());
        // Clusters above 8 CTAs only where the device runs clusters of 16.
        const int groups = static_cast<int>(heads / 64);
        const dsv4::detail::SparseLaunchReport report = dsv4::detail::sparse_decode_launch_report(
            dsv4::detail::validate_sparse_decode(shape.params(c)), 0);
        if (GetParam().kernel != SparseKernel::kCudaCore) {
          EXPECT_LE(report.plan.splits, std::min(splits, 16 / groups)) << splits;
          EXPECT_GE(report.plan.splits, std::min(splits, 8 / groups)) << splits;
        }
      }
#endif
      run_sparse_case(c, GetParam());
    }
  }
}

// Rows held by one CTA each (one head group, one split: the combine of a single partial) at
// every output dtype, with outputs off the vector grid, heads that do not fill the group, and
// an empty row.
TEST_P(SparseDecode, RowsOfOneCta) {
  uint64_t seed = 400;
  for (int64_t heads : {64, 48}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
      for (bool misaligned : {false, true}) {
        SparseCase c;
        c.N = 3;
        c.heads = heads;
        c.L = 300;
        c.out_dtype = dtype;
        c.misaligned = misaligned;
        c.empty_rows = std::vector<int64_t>{1};
        c.seed = seed++;
        ForcedSplits forced(1);
        run_sparse_case(c, GetParam());
      }
    }
  }
}

// Batches of the bandwidth target (N >= 32) with Flash's and Pro's heads: one list split or none.
TEST_P(SparseDecode, Batches) {
  SparseCase c;
  c.N = 40;
  c.L = 128 + 512;
  c.num_blocks = 16;
  c.empty_rows = std::vector<int64_t>{7, 39};
  c.seed = 6;
  run_sparse_case(c, GetParam());
  c.N = 33;
  c.heads = 128;
  c.L = 200;
  c.index_dtype = DType::kInt64;
  c.out_dtype = DType::kFloat32;
  c.seed = 7;
  run_sparse_case(c, GetParam());
}

TEST_P(SparseDecode, SmallShapes) {
  const int64_t heads[] = {1, 5, 17, 16, 48};
  const int64_t lengths[] = {0, 1, 7, 33};
  const int64_t block_sizes[] = {1, 3, 64};
  uint64_t seed = 100;
  for (int64_t H : heads) {
    for (int64_t L : lengths) {
      for (int64_t bs : block_sizes) {
        SparseCase c;
        c.N = 3;
        c.heads = H;
        c.L = L;
        c.block_size = bs;
        c.num_blocks = 64 / bs + 1;
        c.sink = seed % 2 == 0;
        c.lse = seed % 3 != 0;
        c.scale = seed % 4 == 0 ? 0.1f : 0.0f;
        c.q_dtype = seed % 5 == 0 ? DType::kFloat32 : DType::kBFloat16;
        c.out_dtype = seed % 3 == 1 ? DType::kFloat32 : DType::kBFloat16;
        c.index_dtype = seed % 2 ? DType::kInt64 : DType::kInt32;
        c.empty_rows.assign(1, static_cast<int64_t>(seed % 4));
        c.seed = seed++;
        run_sparse_case(c, GetParam());
      }
    }
  }
}

// Head counts the tensor-core kernel serves with a partial last group of 64, and list lengths
// around its 64-entry tiles.
TEST_P(SparseDecode, HeadGroupsAndTileEdges) {
  uint64_t seed = 200;
  for (int64_t H : {32, 80, 192, 320}) {
    for (int64_t L : {63, 64, 65, 129}) {
      SparseCase c;
      c.N = 2;
      c.heads = H;
      c.L = L;
      c.block_size = 16;
      c.num_blocks = 9;
      c.q_dtype = seed % 2 ? DType::kFloat32 : DType::kBFloat16;
      c.out_dtype = seed % 3 ? DType::kBFloat16 : DType::kFloat32;
      c.sink = seed % 4 != 1;
      c.seed = seed++;
      run_sparse_case(c, GetParam());
    }
  }
}

TEST_P(SparseDecode, EmptyListGivesZeroAndTheSinkAsLse) {
  for (bool sink : {true, false}) {
    for (int64_t heads : {int64_t{4}, int64_t{64}}) {
      SparseCase c;
      c.N = 2;
      c.heads = heads;
      c.L = 70;
      c.sink = sink;
      c.out_dtype = DType::kFloat32;
      c.empty_rows = std::vector<int64_t>{0, 1};
      SparseInputs in = make_sparse_inputs(c);
      if (refused_by_tensor_core(c, in, GetParam())) continue;
      run_sparse_backend(c, in, GetParam());
      for (int64_t i = 0; i < c.N * c.heads * dsv4::kHeadDim; ++i)
        ASSERT_EQ(read_float(in.out, DType::kFloat32, static_cast<size_t>(i)), 0.0f);
      for (int64_t i = 0; i < c.N * c.heads; ++i)
        EXPECT_EQ(in.lse[i], sink ? in.sink[i % c.heads] : -kInf);
      EXPECT_EQ(read_counter(in.counter, DType::kInt64), 3);
    }
  }
}

TEST_P(SparseDecode, NaNQueryOrNaNEntryZeroesAndCountsTheRow) {
  // 20 heads: two CPU head blocks; 80: two tensor-core head groups (a cluster of CTAs that must
  // agree). A bad value in either zeroes every head of the row. fp32 q is checked as it is
  // rounded, bf16 q (copied as stored) by the scores it gives: row 4's list is all negative, so
  // its scores are against zero rows.
  for (int form = 0; form < 4; ++form) {
    const int64_t heads = form % 2 == 0 ? 20 : 80;
    SparseCase c;
    c.N = 5;
    c.heads = heads;
    c.L = 40;
    c.q_dtype = form < 2 ? DType::kFloat32 : DType::kBFloat16;
    c.empty_rows = std::vector<int64_t>{4};
    SparseInputs in = make_sparse_inputs(c);
    in.q[(0 * c.heads + heads - 1) * dsv4::kHeadDim + 3] = kNaN;  // row 0: NaN query, last head
    in.q[(1 * c.heads + 0) * dsv4::kHeadDim + 500] = kInf;        // row 1: infinite query
    in.q[(4 * c.heads + 1) * dsv4::kHeadDim + 300] = -kInf;       // row 4: and an empty list
    in.q_bytes = encode_rows(in.q, c.q_dtype);
    // Row 2 names an entry stored with NaN markers.
    std::vector<float> bad(dsv4::kHeadDim, 0.5f);
    bad[100] = kNaN;
    const int64_t nan_slot = 7;
    store_rows(in.cache, c, bad, {nan_slot});
    put_index(in.indices, c.index_dtype, 2 * c.L + 11, nan_slot);
    for (int64_t n : {0, 1, 3}) {  // and no other row does
      for (int64_t l = 0; l < c.L; ++l) {
        if (in.slots[n * c.L + l] == nan_slot) {
          put_index(in.indices, c.index_dtype, n * c.L + l, -1);
        }
      }
    }
    const dsv4::SparseDecodeReference ref = sparse_reference(c, in);
    ASSERT_EQ(ref.invalid_rows, 4);
    ASSERT_FALSE(ref.invalid[3]);
    if (refused_by_tensor_core(c, in, GetParam())) continue;
    run_sparse_backend(c, in, GetParam());
    EXPECT_EQ(read_counter(in.counter, DType::kInt64), 7);
    check_sparse_outputs(c, in, ref, GetParam().kernel);
    for (int64_t n : {0, 1, 2, 4}) {
      for (int64_t h = 0; h < c.heads; ++h)
        EXPECT_TRUE(std::isnan(in.lse[n * c.heads + h])) << n << " " << h;
    }
  }
}

// Without a list at all (L + L2 = 0) a tensor-core CTA has no scores to tell a non-finite bf16
// query by, and checks its copy of the queries instead.
TEST_P(SparseDecode, NaNQueryWithoutAListZeroesAndCountsTheRow) {
  for (DType q_dtype : {DType::kBFloat16, DType::kFloat32}) {
    SparseCase c;
    c.N = 3;
    c.heads = 64;
    c.L = 0;
    c.q_dtype = q_dtype;
    SparseInputs in = make_sparse_inputs(c);
    in.q[(1 * c.heads + 9) * dsv4::kHeadDim + 77] = kNaN;  // row 1 only
    in.q_bytes = encode_rows(in.q, c.q_dtype);
    const dsv4::SparseDecodeReference ref = sparse_reference(c, in);
    ASSERT_EQ(ref.invalid_rows, 1);
    ASSERT_TRUE(ref.invalid[1]);
    run_sparse_backend(c, in, GetParam());
    EXPECT_EQ(read_counter(in.counter, DType::kInt64), 4);
    check_sparse_outputs(c, in, ref, GetParam().kernel);
    for (int64_t h = 0; h < c.heads; ++h) {
      EXPECT_TRUE(std::isnan(in.lse[1 * c.heads + h])) << h;
      EXPECT_EQ(in.lse[h], in.sink[h]) << h;  // rows 0 and 2: empty lists, lse = the sink
      EXPECT_EQ(in.lse[2 * c.heads + h], in.sink[h]) << h;
    }
  }
}

// A NaN sink makes every row invalid (the sink is per head, shared by the rows), the empty one
// included.
TEST_P(SparseDecode, NaNSinkMakesEvenAnEmptyRowInvalid) {
  SparseCase c;
  c.N = 3;
  c.heads = 64;
  c.L = 30;
  c.empty_rows = std::vector<int64_t>{0};
  SparseInputs in = make_sparse_inputs(c);
  in.sink[5] = kNaN;
  const dsv4::SparseDecodeReference ref = sparse_reference(c, in);
  ASSERT_EQ(ref.invalid_rows, 3);
  run_sparse_backend(c, in, GetParam());
  EXPECT_EQ(read_counter(in.counter, DType::kInt64), 6);
  check_sparse_outputs(c, in, ref, GetParam().kernel);
}

// The CPU (and CUDA with check_indices) throws before writing; CUDA otherwise makes the row
// invalid (o = 0, lse = NaN, counted) and computes the others.
TEST_P(SparseDecode, IndexBeyondTheCache) {
  for (int64_t heads : {int64_t{2}, int64_t{64}}) {
    SparseCase c;
    c.N = 3;
    c.heads = heads;
    c.L = 70;
    SparseInputs in = make_sparse_inputs(c);
    put_index(in.indices, c.index_dtype, 1 * c.L + 66, c.num_blocks * c.block_size);
    if (refused_by_tensor_core(c, in, GetParam())) continue;
    const std::vector<uint8_t> poisoned = in.out;
    for (bool check_indices : {true, false}) {
      SCOPED_TRACE(check_indices ? "check_indices" : "no host check");
      if (GetParam().backend == Backend::kCPU || check_indices) {
        expect_error([&] { run_sparse_backend(c, in, GetParam(), check_indices); },
                     "indices[1, 66] = 512 is beyond the cache");
        EXPECT_EQ(in.out, poisoned);
        EXPECT_EQ(in.lse[0], 12345.0f);
        continue;
      }
      // The reference of the same inputs with the bad index skipped, then row 1 made invalid.
      SparseInputs skipped = in;
      put_index(skipped.indices, c.index_dtype, 1 * c.L + 66, -1);
      dsv4::SparseDecodeReference ref = sparse_reference(c, skipped);
      ref.invalid[1] = 1;
      std::fill(&ref.out[1 * c.heads * dsv4::kHeadDim], &ref.out[2 * c.heads * dsv4::kHeadDim],
                0.0);
      std::fill(&ref.lse[1 * c.heads], &ref.lse[2 * c.heads], std::nan(""));
      run_sparse_backend(c, in, GetParam(), check_indices);
      EXPECT_EQ(read_counter(in.counter, DType::kInt64), 4);
      check_sparse_outputs(c, in, ref, GetParam().kernel);
    }
  }
}

// The same for an index of the extra list beyond the extra cache.
TEST_P(SparseDecode, ExtraIndexBeyondItsCache) {
  SparseCase c;
  c.N = 3;
  c.heads = 64;
  c.L = 20;
  c.extra_L = 70;
  SparseInputs in = make_sparse_inputs(c);
  put_index(in.extra_indices, c.index_dtype, 2 * c.extra_L + 65,
            c.extra_num_blocks * c.extra_block_size);
  const std::vector<uint8_t> poisoned = in.out;
  for (bool check_indices : {true, false}) {
    SCOPED_TRACE(check_indices ? "check_indices" : "no host check");
    if (GetParam().backend == Backend::kCPU || check_indices) {
      expect_error([&] { run_sparse_backend(c, in, GetParam(), check_indices); },
                   "extra_indices[2, 65] = 384 is beyond the cache");
      EXPECT_EQ(in.out, poisoned);
      continue;
    }
    SparseInputs skipped = in;
    put_index(skipped.extra_indices, c.index_dtype, 2 * c.extra_L + 65, -1);
    dsv4::SparseDecodeReference ref = sparse_reference(c, skipped);
    ref.invalid[2] = 1;
    std::fill(&ref.out[2 * c.heads * dsv4::kHeadDim], &ref.out[3 * c.heads * dsv4::kHeadDim], 0.0);
    std::fill(&ref.lse[2 * c.heads], &ref.lse[3 * c.heads], std::nan(""));
    run_sparse_backend(c, in, GetParam(), check_indices);
    EXPECT_EQ(read_counter(in.counter, DType::kInt64), 4);
    check_sparse_outputs(c, in, ref, GetParam().kernel);
  }
}

std::string sparse_run_name(const ::testing::TestParamInfo<SparseRun>& info) {
  return std::string(kernel_name(info.param.kernel)) + (info.param.workspace ? "_workspace" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Backends, SparseDecode,
    ::testing::Values(SparseRun{Backend::kCPU, SparseKernel::kCpu},
                      SparseRun{Backend::kCUDA, SparseKernel::kTensorCore},
                      SparseRun{Backend::kCUDA, SparseKernel::kTensorCorePipelined},
                      SparseRun{Backend::kCUDA, SparseKernel::kCudaCore},
                      SparseRun{Backend::kCUDA, SparseKernel::kTensorCore, true},
                      SparseRun{Backend::kCUDA, SparseKernel::kTensorCorePipelined, true},
                      SparseRun{Backend::kCUDA, SparseKernel::kDispatch, true}),
    sparse_run_name);

TEST(SparseDecodeArguments, ValidationNamesTheArgument) {
  SparseCase c;
  c.N = 2;
  c.heads = 4;
  c.L = 6;
  c.extra_L = 2;
  SparseInputs in = make_sparse_inputs(c);
  std::vector<float> spare(8192);
  std::vector<uint8_t> workspace_bytes(4096);
  uint8_t* const aligned =
      workspace_bytes.data() + (256 - reinterpret_cast<uintptr_t>(workspace_bytes.data()) % 256);
  const int64_t N = c.N, H = c.heads;
  struct Bad {
    std::function<void(dsv4::SparseDecodeParams&)> change;
    std::string needle;
  };
  const std::vector<Bad> cases = {
      {[](dsv4::SparseDecodeParams& p) { p.q = TensorView(); }, "argument 'q' is required"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.q = TensorView::contiguous(in.q_bytes.data(), DType::kBFloat16, {N, H, 576});
       },
       "argument 'q'"},
      {[](dsv4::SparseDecodeParams& p) { p.block_size = 32; }, "argument 'cache'"},
      {[](dsv4::SparseDecodeParams& p) { p.block_size = -1; }, "option 'block_size'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.indices = TensorView::contiguous(in.indices.data(), DType::kInt32, {N + 1, 2});
       },
       "argument 'indices'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.indices = TensorView::contiguous(in.indices.data(), DType::kFloat32, {N, 6});
       },
       "argument 'indices'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.sink = TensorView::contiguous(spare.data(), DType::kFloat32, {H + 1});
       },
       "argument 'sink'"},
      {[](dsv4::SparseDecodeParams& p) { p.scale = kNaN; }, "option 'scale'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.out = TensorView::contiguous(spare.data(), DType::kFloat16, {N, H, 512});
       },
       "argument 'out'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.out = TensorView::strided(spare.data(), DType::kFloat32, {N, H, 512}, {1, N, N * H});
       },
       "argument 'out'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.lse = TensorView::contiguous(spare.data(), DType::kFloat32, {N, H + 1});
       },
       "argument 'lse'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.lse = TensorView::contiguous(in.out.data(), DType::kFloat32, {N, H});
       },
       "'lse'"},  // overlaps out
      {[&](dsv4::SparseDecodeParams& p) {
         p.invalid_count = TensorView::contiguous(spare.data(), DType::kInt32, {2});
       },
       "argument 'invalid_count'"},
      {[](dsv4::SparseDecodeParams& p) { p.sink.device = Device::cuda(0); }, "argument 'sink'"},
      {[](dsv4::SparseDecodeParams& p) { p.q.device = Device::cuda(0); },
       "argument 'q' is on cuda:0 but cache, indices"},
      {[](dsv4::SparseDecodeParams& p) { p.out.strides[1] = 0; },
       "argument 'out' has stride 0 in dim 1"},  // every head's output in one place
      {[](dsv4::SparseDecodeParams& p) { p.extra_indices = TensorView(); },
       "'extra_cache' and 'extra_indices' go together"},
      {[](dsv4::SparseDecodeParams& p) { p.extra_block_size = 0; }, "option 'extra_block_size'"},
      {[](dsv4::SparseDecodeParams& p) { p.extra_block_size = 64; }, "argument 'extra_cache'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.extra_indices =
             TensorView::contiguous(in.extra_indices.data(), DType::kInt32, {N + 1, 1});
       },
       "argument 'extra_indices'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.lse = TensorView::contiguous(in.extra_cache.data(), DType::kFloat32, {N, H});
       },
       "'lse'"},  // overlaps extra_cache
      {[&](dsv4::SparseDecodeParams& p) {
         p.workspace = TensorView::contiguous(aligned, DType::kFloat32, {64});
       },
       "argument 'workspace'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.workspace = TensorView::contiguous(aligned, DType::kUInt8, {8, 64});
       },
       "argument 'workspace'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.workspace = TensorView::contiguous(aligned + 8, DType::kUInt8, {256});
       },
       "argument 'workspace' must be 256-byte aligned"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.workspace = TensorView::strided(aligned, DType::kUInt8, {256}, {2});
       },
       "argument 'workspace'"},
      {[&](dsv4::SparseDecodeParams& p) {
         p.workspace = TensorView::contiguous(in.out.data(), DType::kUInt8, {64});
       },
       "'workspace'"},  // overlaps out
      {[&](dsv4::SparseDecodeParams& p) {
         p.workspace = TensorView::contiguous(aligned, DType::kUInt8, {256}, Device::cuda(0));
       },
       "argument 'workspace'"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    dsv4::SparseDecodeParams p = in.params(c);
    cases[i].change(p);
    expect_error([&] { dsv4::sparse_decode(p); }, cases[i].needle);
  }
}

// The CPU backend needs no workspace and ignores one; negative sizes are errors.
TEST(AttentionWorkspace, CpuSizesAreZeroAndACpuCallIgnoresIt) {
  EXPECT_EQ(dsv4::sparse_decode_workspace_bytes(4, 64, 640, Device::cpu()), 0);
  EXPECT_EQ(dsv4::index_topk_workspace_bytes(4, 65536, Device::cpu()), 0);
  expect_error([] { dsv4::sparse_decode_workspace_bytes(-1, 64, 640, Device::cpu()); },
               "argument 'num_rows' must not be negative");
  expect_error([] { dsv4::index_topk_workspace_bytes(1, -5, Device::cpu()); },
               "argument 'max_entries' must not be negative");
  SparseCase c;
  c.N = 2;
  c.L = 200;
  SparseInputs plain = make_sparse_inputs(c);
  run_sparse_backend(c, plain, SparseRun{});
  SparseInputs with_workspace = make_sparse_inputs(c);
  run_sparse_backend(c, with_workspace, SparseRun{Backend::kCPU, SparseKernel::kCpu, true});
  EXPECT_EQ(plain.out, with_workspace.out);
  EXPECT_EQ(plain.lse, with_workspace.lse);
}

#ifdef HDK_WITH_CUDA
// A call with a workspace: the bytes it held before do not change the results, and one that
// is too small is refused before anything is written.
TEST(SparseDecodeCuda, WorkspaceContentsDoNotMatterAndTooSmallIsAnError) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  SparseCase c;
  c.N = 3;
  c.heads = 128;
  c.L = 1024;
  c.extra_L = 128;
  c.num_blocks = 24;
  c.empty_rows = std::vector<int64_t>{1};
  SparseRun run{Backend::kCUDA, SparseKernel::kTensorCorePipelined, true};
  SparseInputs first = make_sparse_inputs(c);
  run_sparse_backend(c, first, run);
  const dsv4::SparseDecodeReference ref = sparse_reference(c, first);
  check_sparse_outputs(c, first, ref, run.kernel);
  for (uint64_t seed : {11u, 12u}) {
    // The same inputs over a workspace of other random bytes (run_sparse_backend drew its from
    // the case's seed).
    SparseInputs second = make_sparse_inputs(c);
    dsv4::SparseDecodeParams p = second.params(c);
    const Device cuda = backend_device(Backend::kCUDA);
    std::vector<DeviceBuffer> buffers;
    auto place = [&](TensorView& view, const void* host, size_t bytes) {
      buffers.emplace_back(Backend::kCUDA, std::max<size_t>(bytes, 1));
      buffers.back().upload(host, bytes);
      view.data = buffers.back().data();
      view.device = cuda;
    };
    place(p.q, second.q_bytes.data(), second.q_bytes.size());
    place(p.cache, second.cache.data(), second.cache.size());
    place(p.indices, second.indices.data(), second.indices.size());
    place(p.extra_cache, second.extra_cache.data(), second.extra_cache.size());
    place(p.extra_indices, second.extra_indices.data(), second.extra_indices.size());
    place(p.sink, second.sink.data(), second.sink.size() * 4);
    place(p.out, second.out.data(), second.out.size());
    place(p.lse, second.lse.data(), second.lse.size() * 4);
    place(p.invalid_count, second.counter.data(), second.counter.size());
    const std::vector<uint8_t> noise = random_bytes(sparse_workspace_size(c, cuda), seed);
    p.workspace =
        TensorView::contiguous(nullptr, DType::kUInt8, {static_cast<int64_t>(noise.size())});
    place(p.workspace, noise.data(), noise.size());
    {
      const ForcedSparseKernel forced(run);
      dsv4::sparse_decode(p);
    }
    synchronize(Backend::kCUDA);
    buffers[6].download(second.out.data(), second.out.size());
    buffers[7].download(second.lse.data(), second.lse.size() * 4);
    EXPECT_EQ(second.out, first.out) << "workspace seed " << seed;
    EXPECT_EQ(0, std::memcmp(second.lse.data(), first.lse.data(), first.lse.size() * 4));

    // One byte short: an error naming the workspace, and out as it was.
    const std::vector<uint8_t> poison(second.out.size(), 0xff);
    buffers[6].upload(poison.data(), poison.size());
    p.workspace.shape[0] =
        dsv4::sparse_decode_workspace_bytes(c.N, c.heads, c.L + c.extra_L, cuda) - 1;
    expect_error([&] { dsv4::sparse_decode(p); }, "argument 'workspace' must hold at least");
    synchronize(Backend::kCUDA);
    std::vector<uint8_t> after(poison.size());
    buffers[6].download(after.data(), after.size());
    EXPECT_EQ(after, poison);
  }
}

// The kernels' instances exist for the group sizes the plan makes (64 heads; 32 and 16 through
// the workspace); any other size is an error naming it, not another size's kernel. Host code
// only: no device needed.
TEST(SparseDecodeCuda, InstancesRefuseGroupSizesThePlanNeverMakes) {
  using dsv4::detail::sparse_decode_combine_instance;
  using dsv4::detail::sparse_decode_mma_instance;
  using dsv4::detail::sparse_decode_pipelined_instance;
  using dsv4::detail::SparsePartials;
  const SparsePartials kFp32 = SparsePartials::kFp32Records, kBf16 = SparsePartials::kBf16Records,
                       kCluster = SparsePartials::kInCluster;
  for (const bool wide : {false, true}) {
    for (const int heads : {16, 32, 64}) {
      for (const SparsePartials records : {kFp32, kBf16})
        EXPECT_NE(sparse_decode_mma_instance(wide, records, heads), nullptr);
      for (const bool bf16_records : {false, true})
        EXPECT_NE(sparse_decode_combine_instance(heads, bf16_records), nullptr);
    }
    EXPECT_NE(sparse_decode_mma_instance(wide, kCluster, 64), nullptr);
    for (const SparsePartials records : {kFp32, kBf16}) {
      expect_error([&] { sparse_decode_mma_instance(wide, records, 48); },
                   "no tensor-core instance for groups of 48 heads through the workspace");
      expect_error([&] { sparse_decode_mma_instance(wide, records, 128); },
                   "no tensor-core instance for groups of 128 heads");
    }
    expect_error([&] { sparse_decode_mma_instance(wide, kCluster, 32); },
                 "no tensor-core instance for groups of 32 heads in a cluster");
  }
  expect_error([] { sparse_decode_combine_instance(8, true); },
               "no combine instance for groups of 8 heads");
  // Distinct sizes and record types are distinct kernels.
  EXPECT_NE(sparse_decode_mma_instance(true, kFp32, 16),
            sparse_decode_mma_instance(true, kFp32, 64));
  EXPECT_NE(sparse_decode_mma_instance(true, kFp32, 32),
            sparse_decode_mma_instance(true, kBf16, 32));
  EXPECT_NE(sparse_decode_pipelined_instance(true, false, kFp32),
            sparse_decode_pipelined_instance(true, false, kBf16));
  EXPECT_NE(sparse_decode_pipelined_instance(false, true, kCluster),
            sparse_decode_pipelined_instance(false, true, kFp32));
  EXPECT_NE(sparse_decode_combine_instance(32, false), sparse_decode_combine_instance(64, false));
  EXPECT_NE(sparse_decode_combine_instance(64, true), sparse_decode_combine_instance(64, false));
}

// The dispatcher with a workspace: a few rows take one tile a CTA (two where one tile a CTA
// would not fit one wave: Pro at 4 rows, a list of 68 tiles) on the kernel that converts on all 8
// warps (plan_sparse_fewest_tiles), in head groups of 16 or 32 where the SMs left over hold them
// (the last group cut at Hq for 80 and 48 heads), against the float64 reference; more rows than
// one wave of such CTAs keep the pipelined kernel.
TEST(SparseDecodeCuda, FewRowsTakeTheFewestTilesACta) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  // A host workspace view for the launch report (a CPU call needs none of its bytes; validation
  // wants it 256-byte aligned).
  std::vector<uint8_t> workspace(512);
  auto host_workspace_view = [](std::vector<uint8_t>& bytes) {
    uint8_t* const aligned =
        bytes.data() + (256 - reinterpret_cast<uintptr_t>(bytes.data()) % 256) % 256;
    return TensorView::contiguous(aligned, DType::kUInt8, {256});
  };
  int sm_count = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  struct Shape {
    int64_t rows, heads, L, extra_L;
  };
  // Lists of 2 tiles (a window with its step) are split while a call has at most 8 (row, group
  // of 64 heads) pairs (kSparseShortListMaxRowGroups).
  for (const Shape shape :
       {Shape{2, 64, 512, 128}, Shape{1, 128, 1024, 128}, Shape{3, 64, 200, 128},
        Shape{1, 64, 4200, 128}, Shape{4, 128, 1024, 128}, Shape{3, 64, 64, 64},
        Shape{4, 128, 100, 28}, Shape{2, 80, 1000, 128}, Shape{5, 48, 512, 128},
        Shape{8, 128, 512, 128}}) {
    SparseCase c;
    c.N = shape.rows;
    c.heads = shape.heads;
    c.L = shape.L;
    c.extra_L = shape.extra_L;
    c.num_blocks = 20;
    c.empty_rows = std::vector<int64_t>{c.N - 1};
    c.seed = 500 + shape.heads + shape.L;
    SCOPED_TRACE(c.describe());
    const int64_t tiles = dsv4::detail::sparse_tiles(c.L + c.extra_L);
    const int64_t groups = dsv4::detail::sparse_head_groups(c.heads);
    // Two tiles a CTA only for lists of 17 tiles or more (kSparseTwoTileMinTiles), 10 for two
    // head groups.
    const int64_t two_tiles_from = groups == 2 ? 10 : 17;
    const int64_t splits = tiles <= 64 && c.N * groups * tiles <= sm_count ? tiles
                           : tiles >= two_tiles_from                       ? (tiles + 1) / 2
                                                                           : sm_count + 1;
    if (c.N * groups * splits > sm_count) continue;  // a device too small for one wave of them
    // The smallest head group whose CTAs still fit the wave.
    int group_heads = 64;
    while (group_heads > 16) {
      const int64_t smaller = (c.heads + group_heads / 2 - 1) / (group_heads / 2);
      if (c.N * smaller * splits > sm_count) break;
      group_heads /= 2;
    }
    const SparseRun run{Backend::kCUDA, SparseKernel::kDispatch, true};
    SparseInputs in = make_sparse_inputs(c);
    {
      const ForcedSparseKernel forced(run);
      dsv4::SparseDecodeParams p = in.params(c);
      p.workspace = host_workspace_view(workspace);
      const dsv4::detail::SparseLaunchReport report =
          dsv4::detail::sparse_decode_launch_report(dsv4::detail::validate_sparse_decode(p), 0);
      EXPECT_STREQ(report.kernel, "mma");
      EXPECT_EQ(report.plan.splits, splits);
      EXPECT_EQ(report.plan.group_heads, group_heads);
      EXPECT_TRUE(report.plan.through_workspace);
    }
    const dsv4::SparseDecodeReference ref = sparse_reference(c, in);
    run_sparse_backend(c, in, run);
    EXPECT_EQ(read_counter(in.counter, DType::kInt64), 3 + ref.invalid_rows);
    check_sparse_outputs(c, in, ref, SparseKernel::kTensorCore);
  }
  // One wave too many: the pipelined kernel, as without the rule.
  SparseCase many;
  many.N = sm_count / 10 + 1;
  many.L = 512;
  many.extra_L = 128;
  many.num_blocks = 20;
  SparseInputs in = make_sparse_inputs(many);
  const ForcedSparseKernel forced(SparseRun{Backend::kCUDA, SparseKernel::kDispatch, true});
  dsv4::SparseDecodeParams p = in.params(many);
  p.workspace = host_workspace_view(workspace);
  const dsv4::detail::SparseLaunchReport report =
      dsv4::detail::sparse_decode_launch_report(dsv4::detail::validate_sparse_decode(p), 0);
  EXPECT_STREQ(report.kernel, "pipelined");
}

// Rows of Pro's heads and CSA list (18 tiles) that do not fit one wave of one- or two-tile CTAs
// split through the workspace on the pipelined kernel down to 2 tiles a CTA where their records
// are bf16 (plan_sparse_workspace): at 8 rows on 132 SMs, 8 splits in place of a cluster of 4;
// at 11 rows 6 splits, combined in 8 column slices (sparse_combine_launch_slices). fp32 outputs
// keep fp32 records and 4 tiles a split. Each checked against the float64 reference.
TEST(SparseDecodeCuda, Bf16RecordsSplitDownToTwoTiles) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  int sm_count = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const auto& [rows, out] : {std::make_pair(sm_count / 16, DType::kBFloat16),
                                  std::make_pair(sm_count / 12, DType::kBFloat16),
                                  std::make_pair(sm_count / 16, DType::kFloat32)}) {
    SparseCase c;
    c.N = rows;  // 8 on 132 SMs: 16 (row, group) pairs, 8 CTAs each; 11: 22 pairs, 6 CTAs
    c.heads = 128;
    c.L = 1024;
    c.extra_L = 128;
    c.num_blocks = 40;
    c.out_dtype = out;
    c.empty_rows = std::vector<int64_t>{c.N - 1};
    c.seed = 900 + static_cast<uint64_t>(rows) + static_cast<uint64_t>(out == DType::kFloat32);
    SCOPED_TRACE(c.describe());
    const dsv4::detail::SparsePlan expected = dsv4::detail::plan_sparse_workspace(
        c.N, c.heads, c.L + c.extra_L, sm_count, dsv4::detail::kSparsePipelinedCosts,
        out == DType::kBFloat16);
    EXPECT_EQ(expected.bf16_records, out == DType::kBFloat16);
    const SparseRun run{Backend::kCUDA, SparseKernel::kDispatch, true};
    SparseInputs in = make_sparse_inputs(c);
    const dsv4::SparseDecodeReference ref = sparse_reference(c, in);
    run_sparse_backend(c, in, run);
    EXPECT_EQ(read_counter(in.counter, DType::kInt64), 3 + ref.invalid_rows);
    check_sparse_outputs(c, in, ref, SparseKernel::kTensorCore);
    if (out != DType::kBFloat16 || rows != sm_count / 16) continue;
    // The plan the dispatcher ran, from a host view of a workspace (its bytes are not read).
    std::vector<uint8_t> workspace(512);
    uint8_t* const aligned =
        workspace.data() + (256 - reinterpret_cast<uintptr_t>(workspace.data()) % 256) % 256;
    const ForcedSparseKernel forced(run);
    dsv4::SparseDecodeParams p = in.params(c);
    p.workspace = TensorView::contiguous(aligned, DType::kUInt8, {256});
    const dsv4::detail::SparseLaunchReport report =
        dsv4::detail::sparse_decode_launch_report(dsv4::detail::validate_sparse_decode(p), 0);
    if (sm_count == 132) {
      EXPECT_STREQ(report.kernel, "pipelined");
      EXPECT_TRUE(report.plan.through_workspace);
      EXPECT_TRUE(report.plan.bf16_records);
      EXPECT_EQ(report.plan.splits, 8);
    }
  }
}

// The default CUDA path (Flash's heads: the tensor-core kernel; without a workspace a cluster of
// 8 list slices for N = 16 on 132 SMs or so, with one 2 rows over every SM) captured in a CUDA
// graph and replayed; the second replay on new queries copied into the captured buffer, each
// replayed twice for the same bytes. GetParam(): with a workspace.
class SparseDecodeCudaGraph : public ::testing::TestWithParam<bool> {};

TEST_P(SparseDecodeCudaGraph, CapturedAndReplayed) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  SparseCase c;
  c.N = GetParam() ? 2 : 16;
  c.L = 128 + 512;
  c.num_blocks = 12;
  c.empty_rows = std::vector<int64_t>{3};
  SparseInputs in = make_sparse_inputs(c);
  const Device cuda = backend_device(Backend::kCUDA);
  DeviceBuffer q(Backend::kCUDA, in.q_bytes.size()), cache(Backend::kCUDA, in.cache.size()),
      indices(Backend::kCUDA, in.indices.size()), sink(Backend::kCUDA, in.sink.size() * 4),
      out(Backend::kCUDA, in.out.size()), lse(Backend::kCUDA, in.lse.size() * 4),
      counter(Backend::kCUDA, in.counter.size());
  q.upload(in.q_bytes.data(), in.q_bytes.size());
  cache.upload(in.cache.data(), in.cache.size());
  indices.upload(in.indices.data(), in.indices.size());
  sink.upload(in.sink.data(), in.sink.size() * 4);
  out.upload(in.out.data(), in.out.size());
  lse.upload(in.lse.data(), in.lse.size() * 4);
  counter.upload(in.counter.data(), in.counter.size());
  dsv4::SparseDecodeParams p = in.params(c);
  p.q.data = q.data(), p.cache.data = cache.data(), p.indices.data = indices.data();
  p.sink.data = sink.data(), p.out.data = out.data(), p.lse.data = lse.data();
  p.invalid_count.data = counter.data();
  for (TensorView* view : {&p.q, &p.cache, &p.indices, &p.sink, &p.out, &p.lse, &p.invalid_count})
    view->device = cuda;
  // Through a workspace where the plan finds it faster (a few rows spread over the SMs).
  const size_t workspace_bytes = sparse_workspace_size(c, cuda);
  DeviceBuffer workspace(Backend::kCUDA, workspace_bytes);
  workspace.fill(0xab);
  if (GetParam()) {
    p.workspace = TensorView::contiguous(workspace.data(), DType::kUInt8,
                                         {static_cast<int64_t>(workspace_bytes)}, cuda);
  }

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  {
    // The dispatcher's kernel; every row split through the workspace when there is one.
    const ForcedSparseKernel forced(SparseRun{Backend::kCUDA, SparseKernel::kDispatch, GetParam()});
    dsv4::sparse_decode(p, stream);
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    if (replay == 1) {  // new queries, same buffers
      std::mt19937_64 rng(99);
      in.q = normal_values(rng, c.N * c.heads * dsv4::kHeadDim, 1.0f);
      in.q_bytes = encode_rows(in.q, c.q_dtype);
      q.upload(in.q_bytes.data(), in.q_bytes.size());
    }
    const dsv4::SparseDecodeReference ref = sparse_reference(c, in);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    out.download(in.out.data(), in.out.size());
    lse.download(in.lse.data(), in.lse.size() * 4);
    check_sparse_outputs(c, in, ref, SparseKernel::kTensorCore);
    // The same replay again gives the same bytes.
    const std::vector<uint8_t> once = in.out;
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    out.download(in.out.data(), in.out.size());
    EXPECT_EQ(in.out, once);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Workspace, SparseDecodeCudaGraph, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& workspace) {
                           return std::string(workspace.param ? "through_workspace"
                                                              : "in_clusters");
                         });
#endif

// A build without CUDA says so for CUDA tensors, after the same validation as the CPU's.
TEST(SparseDecodeArguments, CudaTensorsWithoutACudaBuild) {
#ifdef HDK_WITH_CUDA
  GTEST_SKIP() << "this build has the CUDA backend";
#else
  SparseCase c;
  c.N = 1;
  c.heads = 2;
  c.L = 3;
  SparseInputs in = make_sparse_inputs(c);
  dsv4::SparseDecodeParams p = in.params(c);
  for (TensorView* view : {&p.q, &p.cache, &p.indices, &p.sink, &p.out, &p.lse, &p.invalid_count})
    view->device = Device::cuda(0);
  expect_error([&] { dsv4::sparse_decode(p); }, "has no CUDA backend");
#endif
}

}  // namespace
}  // namespace testing
}  // namespace hdk
