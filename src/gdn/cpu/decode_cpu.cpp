#include "gdn/cpu/decode_cpu.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/element_io.h"
#include "core/thread_pool.h"
#include "gdn/gating.h"

namespace hdk {
namespace gdn {
namespace detail {
namespace {

using hdk::detail::load_float;
using hdk::detail::load_floats;
using hdk::detail::store_floats;
using hdk::detail::store_zeros;

// Row kernels on 4-float vectors (GCC/Clang vector extensions: one SSE register on baseline
// x86-64, one NEON register on arm64), two accumulators each to hide the add latency. Scalar
// loops did not vectorize cleanly and 8-float vectors were spilled to the stack without AVX.
using float4 = float __attribute__((vector_size(16)));
constexpr int kStep = 8;  // floats per loop iteration: two float4

inline float4 load4(const float* p) {
  float4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store4(float* p, float4 v) {
  std::memcpy(p, &v, sizeof(v));
}

inline float sum4(float4 v) {
  return (v[0] + v[1]) + (v[2] + v[3]);
}

inline void dot_two(const float* row, const float* k, const float* q, int64_t n, float* row_dot_k,
                    float* row_dot_q) {
  float4 k0 = {}, k1 = {}, q0 = {}, q1 = {};
  int64_t j = 0;
  for (; j + kStep <= n; j += kStep) {
    const float4 r0 = load4(row + j);
    const float4 r1 = load4(row + j + 4);
    k0 += r0 * load4(k + j);
    k1 += r1 * load4(k + j + 4);
    q0 += r0 * load4(q + j);
    q1 += r1 * load4(q + j + 4);
  }
  float sum_k = sum4(k0 + k1);
  float sum_q = sum4(q0 + q1);
  for (; j < n; ++j) {
    sum_k += row[j] * k[j];
    sum_q += row[j] * q[j];
  }
  *row_dot_k = sum_k;
  *row_dot_q = sum_q;
}

inline float dot(const float* x, const float* y, int64_t n) {
  float4 a0 = {}, a1 = {};
  int64_t j = 0;
  for (; j + kStep <= n; j += kStep) {
    a0 += load4(x + j) * load4(y + j);
    a1 += load4(x + j + 4) * load4(y + j + 4);
  }
  float sum = sum4(a0 + a1);
  for (; j < n; ++j)
    sum += x[j] * y[j];
  return sum;
}

// row = decay * row + u * k
inline void decay_and_add(float* row, const float* k, float decay, float u, int64_t n) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    store4(row + j, decay * load4(row + j) + u * load4(k + j));
  for (; j < n; ++j)
    row[j] = decay * row[j] + u * k[j];
}

int64_t token_offset(const TokenTensor& x, int64_t request_row, int64_t token, int64_t head) {
  return request_row * x.stride_request + token * x.stride_token + head * x.stride_head;
}

// Per-thread buffers, grown on first use and then reused across calls.
struct Scratch {
  std::vector<float> q, k, v, out, decay, beta, k_dot_q, matrix, row, dots_k, dots_q;
};

Scratch& scratch() {
  thread_local Scratch buffers;
  return buffers;
}

void grow(std::vector<float>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
}

// The per-token vectors of one (request, value head): normalized and scaled q, normalized k,
// v, decay = exp(g), beta and k.q, all in fp32.
void prepare_tokens(const DecodeProblem& p, int64_t row, int64_t origin, int64_t tokens, int64_t hv,
                    Scratch& s) {
  const int64_t K = p.head_k;
  const int64_t V = p.head_v;
  const int64_t h = p.qk_head_of(hv);
  grow(s.q, tokens * K);
  grow(s.k, tokens * K);
  grow(s.v, tokens * V);
  grow(s.out, tokens * V);
  grow(s.decay, tokens);
  grow(s.beta, tokens);
  grow(s.k_dot_q, tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t token = origin + t;
    float* q = s.q.data() + t * K;
    float* k = s.k.data() + t * K;
    load_floats(p.q.data, p.q.dtype, token_offset(p.q, row, token, h), K, q);
    load_floats(p.k.data, p.k.dtype, token_offset(p.k, row, token, h), K, k);
    load_floats(p.v.data, p.v.dtype, token_offset(p.v, row, token, hv), V, s.v.data() + t * V);
    float q_factor = p.scale;
    float k_factor = 1.0f;
    if (p.use_qk_l2norm) {
      q_factor /= std::sqrt(dot(q, q, K) + p.l2norm_eps);
      k_factor /= std::sqrt(dot(k, k, K) + p.l2norm_eps);
    }
    for (int64_t j = 0; j < K; ++j) {
      q[j] *= q_factor;
      k[j] *= k_factor;
    }
    s.k_dot_q[t] = dot(k, q, K);
    float g;
    float beta;
    if (p.fused_gating) {
      const float a = load_float(p.a.data, p.a.dtype, token_offset(p.a, row, token, hv));
      const float b = load_float(p.b.data, p.b.dtype, token_offset(p.b, row, token, hv));
      const float A_log = p.A_log[hv * p.A_log_stride];
      const float dt_bias = load_float(p.dt_bias, p.dt_bias_dtype, hv * p.dt_bias_stride);
      g = fused_log_decay(A_log, a, dt_bias, p.softplus_beta, p.softplus_threshold);
      beta = sigmoid(b);
    } else {
      g = load_float(p.g.data, p.g.dtype, token_offset(p.g, row, token, hv));
      beta = load_float(p.beta.data, p.beta.dtype, token_offset(p.beta, row, token, hv));
    }
    s.decay[t] = std::exp(g);
    s.beta[t] = beta;
  }
}

int64_t slot_offset(const DecodeProblem& p, int64_t slot, int64_t hv) {
  return slot * p.slot_pitch + hv * p.head_pitch;
}

int64_t cache_offset(const DecodeProblem& p, int64_t n, int64_t t, int64_t hv) {
  return n * p.intermediate_stride_request + t * p.intermediate_stride_token + hv * p.head_pitch;
}

// Layout kVK: each row of S (one value index) evolves independently of the others, so rows
// stream through all tokens while they sit in L1, and every state byte moves once.
void run_rows(const DecodeProblem& p, int64_t n, const RequestPlan& plan, int64_t hv, Scratch& s) {
  const int64_t K = p.head_k;
  const int64_t V = p.head_v;
  grow(s.row, K);
  const int64_t read_base = slot_offset(p, plan.read_slot, hv);
  // The decode step's usual case: an fp32 pool updated in place with nothing else stored. The
  // row is then updated where it lies; copying it in and out cost a third of the time.
  const bool in_place = p.state_dtype == DType::kFloat32 && plan.final_slot == plan.read_slot &&
                        p.intermediate_states == nullptr && p.index_mode != IndexMode::kPerToken;
  for (int64_t i = 0; i < V; ++i) {
    float* row = s.row.data();
    if (in_place) {
      row = static_cast<float*>(p.state) + read_base + i * K;
    } else {
      load_floats(p.state, p.state_dtype, read_base + i * K, K, row);
    }
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
      const float* k = s.k.data() + t * K;
      const float* q = s.q.data() + t * K;
      const float decay = s.decay[t];
      float row_dot_k;
      float row_dot_q;
      dot_two(row, k, q, K, &row_dot_k, &row_dot_q);
      // o = S' q with S' = decay S + u k^T, i.e. decay (S q) + u (k.q): one pass for both dots.
      const float u = s.beta[t] * (s.v[t * V + i] - decay * row_dot_k);
      s.out[t * V + i] = decay * row_dot_q + u * s.k_dot_q[t];
      decay_and_add(row, k, decay, u, K);
      if (p.intermediate_states != nullptr) {
        store_floats(p.intermediate_states, p.state_dtype, cache_offset(p, n, t, hv) + i * K, K,
                     row);
      }
      const int64_t token_slot = per_token_write_slot(p, n, t);
      if (token_slot >= 0) {
        store_floats(p.state, p.state_dtype, slot_offset(p, token_slot, hv) + i * K, K, row);
      }
    }
    if (plan.final_slot >= 0 && !in_place) {
      store_floats(p.state, p.state_dtype, slot_offset(p, plan.final_slot, hv) + i * K, K, row);
    }
  }
}

// Layout kKV: S is stored transposed (V contiguous), so the head's matrix is staged in fp32 and
// the dots run as axpy sweeps over its rows.
void run_matrix(const DecodeProblem& p, int64_t n, const RequestPlan& plan, int64_t hv,
                Scratch& s) {
  const int64_t K = p.head_k;
  const int64_t V = p.head_v;
  const int64_t size = K * V;
  grow(s.matrix, size);
  grow(s.dots_k, V);
  grow(s.dots_q, V);
  float* matrix = s.matrix.data();  // matrix[j * V + i] = S[i][j]
  float* dots_k = s.dots_k.data();
  float* dots_q = s.dots_q.data();
  load_floats(p.state, p.state_dtype, slot_offset(p, plan.read_slot, hv), size, matrix);
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    const float* k = s.k.data() + t * K;
    const float* q = s.q.data() + t * K;
    const float decay = s.decay[t];
    for (int64_t i = 0; i < V; ++i) {
      dots_k[i] = 0.0f;
      dots_q[i] = 0.0f;
    }
    for (int64_t j = 0; j < K; ++j) {
      const float* line = matrix + j * V;
      for (int64_t i = 0; i < V; ++i) {
        dots_k[i] += line[i] * k[j];
        dots_q[i] += line[i] * q[j];
      }
    }
    float* u = dots_k;  // reused: u[i] replaces (S k)[i]
    for (int64_t i = 0; i < V; ++i) {
      u[i] = s.beta[t] * (s.v[t * V + i] - decay * dots_k[i]);
      s.out[t * V + i] = decay * dots_q[i] + u[i] * s.k_dot_q[t];
    }
    for (int64_t j = 0; j < K; ++j) {
      float* line = matrix + j * V;
      for (int64_t i = 0; i < V; ++i)
        line[i] = decay * line[i] + u[i] * k[j];
    }
    if (p.intermediate_states != nullptr) {
      store_floats(p.intermediate_states, p.state_dtype, cache_offset(p, n, t, hv), size, matrix);
    }
    const int64_t token_slot = per_token_write_slot(p, n, t);
    if (token_slot >= 0) {
      store_floats(p.state, p.state_dtype, slot_offset(p, token_slot, hv), size, matrix);
    }
  }
  if (plan.final_slot >= 0) {
    store_floats(p.state, p.state_dtype, slot_offset(p, plan.final_slot, hv), size, matrix);
  }
}

void run_head(const DecodeProblem& p, int64_t n, int64_t hv) {
  const RequestPlan plan = plan_request(p, n);
  const int64_t row = p.variable_length ? 0 : n;
  const int64_t V = p.head_v;
  if (plan.read_slot < 0) {
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
      store_zeros(p.out.data, p.out.dtype, token_offset(p.out, row, plan.token_origin + t, hv), V);
    }
    return;
  }
  Scratch& s = scratch();
  prepare_tokens(p, row, plan.token_origin, plan.num_tokens, hv, s);
  if (p.layout == StateLayout::kVK) {
    run_rows(p, n, plan, hv, s);
  } else {
    run_matrix(p, n, plan, hv, s);
  }
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    store_floats(p.out.data, p.out.dtype, token_offset(p.out, row, plan.token_origin + t, hv), V,
                 s.out.data() + t * V);
  }
}

// The per-task loop, with everything it calls inlined (flatten), is built twice on x86-64
// Linux with GCC: for AVX2/FMA machines and for the baseline, picked once at load time. One
// binary runs everywhere and uses wide vectors where they exist (bf16 packing in particular
// is slow on baseline SSE2).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
__attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#endif
void run_tasks(const DecodeProblem& p, int64_t begin, int64_t end) {
  const int64_t heads = p.num_v_heads;
  for (int64_t task = begin; task < end; ++task)
    run_head(p, task / heads, task % heads);
}

}  // namespace

void decode_cpu(const DecodeProblem& p) {
  if (p.invalid_index_count != nullptr) {
    int64_t invalid = 0;
    for (int64_t n = 0; n < p.num_requests; ++n)
      invalid += plan_request(p, n).invalid ? 1 : 0;
    if (p.invalid_index_count_dtype == DType::kInt64) {
      *static_cast<int64_t*>(p.invalid_index_count) += invalid;
    } else {
      *static_cast<int32_t*>(p.invalid_index_count) += static_cast<int32_t>(invalid);
    }
  }
  hdk::detail::parallel_for(p.num_requests * p.num_v_heads,
                            [&](int64_t begin, int64_t end) { run_tasks(p, begin, end); });
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
