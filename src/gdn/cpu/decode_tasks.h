// The CPU decode's per-task loop, written once over a GCC/Clang vector type. Included only by
// the per-instruction-set builds (decode_build_*.cpp), each of which inlines all of it into its
// entry point under its own target; its internal linkage gives every build its own copy.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#ifdef __x86_64__
#include <immintrin.h>
#endif

#include "core/element_io.h"
#include "core/float_convert.h"
#include "core/thread_pool.h"
#include "gdn/cpu/decode_builds.h"
#include "gdn/decode_problem.h"
#include "gdn/gating.h"
#include "hdk/dtype.h"

namespace hdk {
namespace gdn {
namespace detail {
namespace {

using hdk::detail::load_float;
using hdk::detail::load_floats;
using hdk::detail::store_floats;
using hdk::detail::store_zeros;

// Row kernels on GCC/Clang vector extensions, written once for a vector type and built for
// each instruction set (decode_builds.h): 4-float vectors (one SSE or NEON register) for
// the baseline, 8 or 16 floats for AVX2 or AVX-512. Scalar loops did not vectorize
// cleanly, and 8-float vectors were spilled to the stack without AVX. Four accumulators per dot
// hide the FMA latency, which otherwise bounds a 128-float row.
using float4 = float __attribute__((vector_size(16)));
#ifdef HDK_GDN_CPU_X86_BUILDS
using float8 = float __attribute__((vector_size(32)));
using float16 = float __attribute__((vector_size(64)));
// The wide helpers have internal linkage and are always inlined into the build for their
// instruction set, so the calling convention the compilers warn about is never used.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// Everything the per-build entry points (run_tasks_*) call is inlined into them, so that every
// vector operation is compiled for that build's instruction set: flatten alone left functions
// out of line with clang, compiled for the baseline (fp32 rows ran 3x slower).
#define HDK_BUILD_INLINE inline __attribute__((always_inline))

template <typename Vector>
constexpr int64_t kLanes = static_cast<int64_t>(sizeof(Vector) / sizeof(float));

// The integer vectors of a float vector's bits (bf16 widening and rounding).
template <typename Vector>
struct Lanes;

template <>
struct Lanes<float4> {
  using Bits = uint32_t __attribute__((vector_size(16)));
  using HalfBits = uint16_t __attribute__((vector_size(8)));
};

#ifdef HDK_GDN_CPU_X86_BUILDS
template <>
struct Lanes<float8> {
  using Bits = uint32_t __attribute__((vector_size(32)));
  using HalfBits = uint16_t __attribute__((vector_size(16)));
};

template <>
struct Lanes<float16> {
  using Bits = uint32_t __attribute__((vector_size(64)));
  using HalfBits = uint16_t __attribute__((vector_size(32)));
};
#endif

template <typename Vector>
using Bits = typename Lanes<Vector>::Bits;

template <typename Vector>
using HalfBits = typename Lanes<Vector>::HalfBits;

// A vector of state elements as fp32: fp32 rows as they are, bf16 rows widened.
template <typename Vector>
HDK_BUILD_INLINE Vector load_vector(const float* p) {
  Vector v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename Vector>
HDK_BUILD_INLINE Vector load_vector(const uint16_t* p) {
  HalfBits<Vector> half;
  std::memcpy(&half, p, sizeof(half));
  const Bits<Vector> bits = __builtin_convertvector(half, Bits<Vector>) << 16;
  Vector v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

template <typename Vector>
HDK_BUILD_INLINE void store_vector(float* p, Vector v) {
  std::memcpy(p, &v, sizeof(v));
}

// Round to nearest even, NaN kept quiet: the rule of float_to_bf16, without branches.
template <typename Vector>
HDK_BUILD_INLINE void store_vector(uint16_t* p, Vector v) {
  Bits<Vector> bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const Bits<Vector> rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const Bits<Vector> quiet_nan = (bits >> 16) | 0x40u;
  const Bits<Vector> is_nan = (bits & 0x7fffffffu) > 0x7f800000u;  // all ones where NaN
  const HalfBits<Vector> half =
      __builtin_convertvector((is_nan & quiet_nan) | (~is_nan & rounded), HalfBits<Vector>);
  std::memcpy(p, &half, sizeof(half));
}

#ifdef HDK_GDN_CPU_X86_BUILDS
// A bf16 element stored with AVX512-BF16's conversion (same rounding and NaN rule, one
// instruction for 16 lanes instead of about ten); only the AVX512-BF16 build uses it.
struct NativeBf16 {
  uint16_t bits;
};

template <typename Vector>
HDK_BUILD_INLINE Vector load_vector(const NativeBf16* p) {
  return load_vector<Vector>(&p->bits);
}

// The rounding of float_to_bf16 one element at a time, for the rare vector holding a denormal,
// which AVX512-BF16's conversion would flush to zero.
inline void store_bf16_elements(NativeBf16* p, const float16& v) {
  float values[16];
  std::memcpy(values, &v, sizeof(values));
  for (int i = 0; i < 16; ++i)
    p[i].bits = hdk::detail::float_to_bf16(values[i]);
}

// Not always_inline: it carries its own target, and the build's flatten inlines it. The vector
// comes by reference: passing it by value between functions of different targets changes the
// calling convention, which clang rejects.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) inline void
store_native_bf16(NativeBf16* p, const float16& v) {
  __m512 x;
  std::memcpy(&x, &v, sizeof(x));
  if (_mm512_fpclass_ps_mask(x, 0x20) != 0) {  // a denormal
    store_bf16_elements(p, v);
    return;
  }
  const __m256bh packed = _mm512_cvtneps_pbh(x);
  std::memcpy(p, &packed, sizeof(packed));
}

template <typename Vector>
HDK_BUILD_INLINE void store_vector(NativeBf16* p, Vector v) {
  store_native_bf16(p, v);
}

HDK_BUILD_INLINE float load_scalar(const NativeBf16* p) {
  return hdk::detail::bf16_to_float(p->bits);
}

HDK_BUILD_INLINE void store_scalar(NativeBf16* p, float value) {
  p->bits = hdk::detail::float_to_bf16(value);
}
#endif

// Stores that bypass the caches, for rows no later call will find there. Off by default since
// the full-row prefetch below (HDK_CPU_STREAM_STORES=1 turns them on for pools over
// kStreamingBytes): with it, streaming stores made fp32 qwen3-next B = 64 slower on 2 EPYC
// threads (5.0-5.5 ms against 4.0-4.9 ms with ordinary stores). Each store needs a target
// aligned to its size; Streams says which builds have one.
template <typename Vector, typename Element>
struct Streams {
  static constexpr bool value = false;
};

#ifdef HDK_GDN_CPU_X86_BUILDS
template <>
struct Streams<float8, float> {
  static constexpr bool value = true;
};

template <>
struct Streams<float16, float> {
  static constexpr bool value = true;
};

template <>
struct Streams<float16, NativeBf16> {
  static constexpr bool value = true;
};

// Not always_inline, like store_native_bf16.
__attribute__((target("avx"))) inline void stream_vector(float* p, const float8& v) {
  __m256 x;
  std::memcpy(&x, &v, sizeof(x));
  _mm256_stream_ps(p, x);
}

__attribute__((target("avx512f"))) inline void stream_vector(float* p, const float16& v) {
  __m512 x;
  std::memcpy(&x, &v, sizeof(x));
  _mm512_stream_ps(p, x);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) inline void stream_vector(
    NativeBf16* p, const float16& v) {
  __m512 x;
  std::memcpy(&x, &v, sizeof(x));
  if (_mm512_fpclass_ps_mask(x, 0x20) != 0) {  // a denormal: see store_native_bf16
    store_bf16_elements(p, v);
    return;
  }
  const __m256bh packed = _mm512_cvtneps_pbh(x);
  __m256i bits;
  std::memcpy(&bits, &packed, sizeof(bits));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), bits);
}
#endif

// Calls whose pool traffic exceeds this stream their one-token updates past the caches. A
// constant, because the cache size a CPU reports cannot be trusted (a VM here reports 508 MiB
// of L3 for 2 cores).
constexpr int64_t kStreamingBytes = int64_t{32} << 20;

inline bool streams_state(const DecodeProblem& p) {
  const int64_t state_bytes = p.num_requests * p.num_v_heads * p.head_v * p.head_k *
                              static_cast<int64_t>(dtype_size(p.state_dtype));
  return state_bytes > kStreamingBytes;
}

HDK_BUILD_INLINE float load_scalar(const float* p) {
  return *p;
}

HDK_BUILD_INLINE float load_scalar(const uint16_t* p) {
  return hdk::detail::bf16_to_float(*p);
}

HDK_BUILD_INLINE void store_scalar(float* p, float value) {
  *p = value;
}

HDK_BUILD_INLINE void store_scalar(uint16_t* p, float value) {
  *p = hdk::detail::float_to_bf16(value);
}

// Sums by halving the vector, so the adds form a tree instead of one long chain.
HDK_BUILD_INLINE float sum_lanes(float4 v) {
  return (v[0] + v[2]) + (v[1] + v[3]);
}

template <typename Vector, typename Half>
HDK_BUILD_INLINE Half add_halves(Vector v) {
  Half low;
  Half high;
  std::memcpy(&low, &v, sizeof(Half));
  std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof(Half), sizeof(Half));
  return low + high;
}

#ifdef HDK_GDN_CPU_X86_BUILDS
HDK_BUILD_INLINE float sum_lanes(float8 v) {
  return sum_lanes(add_halves<float8, float4>(v));
}

HDK_BUILD_INLINE float sum_lanes(float16 v) {
  return sum_lanes(add_halves<float16, float8>(v));
}
#endif

// row.k and row.q in one pass over the row, which may be stored fp32 or bf16.
template <typename Vector, typename Element>
HDK_BUILD_INLINE void dot_two(const Element* row, const float* k, const float* q, int64_t n,
                              float* row_dot_k, float* row_dot_q) {
  constexpr int64_t L = kLanes<Vector>;
  Vector dk[4] = {}, dq[4] = {};
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L) {
    for (int64_t a = 0; a < 4; ++a) {
      const Vector r = load_vector<Vector>(row + j + a * L);
      dk[a] += r * load_vector<Vector>(k + j + a * L);
      dq[a] += r * load_vector<Vector>(q + j + a * L);
    }
  }
  for (; j + L <= n; j += L) {
    const Vector r = load_vector<Vector>(row + j);
    dk[0] += r * load_vector<Vector>(k + j);
    dq[0] += r * load_vector<Vector>(q + j);
  }
  float sum_k = sum_lanes((dk[0] + dk[1]) + (dk[2] + dk[3]));
  float sum_q = sum_lanes((dq[0] + dq[1]) + (dq[2] + dq[3]));
  for (; j < n; ++j) {
    const float r = load_scalar(row + j);
    sum_k += r * k[j];
    sum_q += r * q[j];
  }
  *row_dot_k = sum_k;
  *row_dot_q = sum_q;
}

template <typename Vector>
HDK_BUILD_INLINE float dot(const float* x, const float* y, int64_t n) {
  constexpr int64_t L = kLanes<Vector>;
  Vector a0 = {}, a1 = {};
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    a0 += load_vector<Vector>(x + j) * load_vector<Vector>(y + j);
    a1 += load_vector<Vector>(x + j + L) * load_vector<Vector>(y + j + L);
  }
  float sum = sum_lanes(a0 + a1);
  for (; j < n; ++j)
    sum += x[j] * y[j];
  return sum;
}

// target = decay * source + u * k; target may be source.
template <typename Vector, typename Element>
HDK_BUILD_INLINE void decay_and_add(const Element* source, Element* target, const float* k,
                                    float decay, float u, int64_t n) {
  constexpr int64_t L = kLanes<Vector>;
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    store_vector<Vector>(target + j,
                         decay * load_vector<Vector>(source + j) + u * load_vector<Vector>(k + j));
  }
  for (; j < n; ++j)
    store_scalar(target + j, decay * load_scalar(source + j) + u * k[j]);
}

inline int64_t token_offset(const TokenTensor& x, int64_t request_row, int64_t token,
                            int64_t head) {
  return request_row * x.stride_request + token * x.stride_token + head * x.stride_head;
}

// Per-thread buffers, grown on first use and then reused across calls.
struct Scratch {
  std::vector<float> q, k, v, out, decay, beta, k_dot_q, matrix, row, dots_k, dots_q;
};

inline Scratch& scratch() {
  thread_local Scratch buffers;
  return buffers;
}

inline void grow(std::vector<float>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
}

// 0 when every value is finite, NaN otherwise (x - x is NaN exactly for NaN and infinities):
// no branch per element, so the loop vectorizes like the loads around it.
HDK_BUILD_INLINE float nonfinite_marker(const float* values, int64_t count) {
  float marker = 0.0f;
  for (int64_t j = 0; j < count; ++j)
    marker += values[j] - values[j];
  return marker;
}

// The per-token vectors of one (request, value head): normalized and scaled q, normalized k,
// v, decay = exp(g), beta and k.q, all in fp32. Returns how many tokens, from the first, have
// only finite inputs: the head runs those and is refused from the next (docs/gdn-decode.md).
template <typename Vector>
HDK_BUILD_INLINE int64_t prepare_tokens(const DecodeProblem& p, int64_t row, int64_t origin,
                                        int64_t tokens, int64_t hv, Scratch& s) {
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
    float marker =
        nonfinite_marker(q, K) + nonfinite_marker(k, K) + nonfinite_marker(s.v.data() + t * V, V);
    float q_factor = p.scale;
    float k_factor = 1.0f;
    if (p.use_qk_l2norm) {
      q_factor /= std::sqrt(dot<Vector>(q, q, K) + p.l2norm_eps);
      k_factor /= std::sqrt(dot<Vector>(k, k, K) + p.l2norm_eps);
    }
    for (int64_t j = 0; j < K; ++j) {
      q[j] *= q_factor;
      k[j] *= k_factor;
    }
    s.k_dot_q[t] = dot<Vector>(k, q, K);
    float g;
    float beta;
    if (p.fused_gating) {
      const float a = load_float(p.a.data, p.a.dtype, token_offset(p.a, row, token, hv));
      const float b = load_float(p.b.data, p.b.dtype, token_offset(p.b, row, token, hv));
      const float A_log = p.A_log[hv * p.A_log_stride];
      const float dt_bias = load_float(p.dt_bias, p.dt_bias_dtype, hv * p.dt_bias_stride);
      g = fused_log_decay(A_log, a, dt_bias, p.softplus_beta, p.softplus_threshold);
      beta = sigmoid(b);
      marker += (a - a) + (b - b);
    } else {
      g = load_float(p.g.data, p.g.dtype, token_offset(p.g, row, token, hv));
      beta = load_float(p.beta.data, p.beta.dtype, token_offset(p.beta, row, token, hv));
      marker += (g - g) + (beta - beta);
    }
    if (marker != 0.0f) return t;
    s.decay[t] = std::exp(g);
    s.beta[t] = beta;
  }
  return tokens;
}

inline int64_t slot_offset(const DecodeProblem& p, int64_t slot, int64_t hv) {
  return slot * p.slot_pitch + hv * p.head_pitch;
}

inline int64_t cache_offset(const DecodeProblem& p, int64_t n, int64_t t, int64_t hv) {
  return n * p.intermediate_stride_request + t * p.intermediate_stride_token + hv * p.head_pitch;
}

// Rows ahead of the one being updated that are prefetched, 8 cache lines each (one fp32 row of
// 128, two bf16 rows), past the head's end too. The hardware prefetchers stop at 4 KiB page
// boundaries (8 fp32 rows of 128). Measured with hdk-bench on 2 EPYC threads, fp32,
// qwen3-next B = 64 (git show 0712de7:bench/results/2026-11-23-cpu): the previous kernel (the first
// line of the row 8 rows ahead, streaming stores over 32 MiB) 4.6-6.1 ms; whole rows, ordinary
// stores 3.8-4.9 ms (this form: 4.2-4.4 ms, 90-108% of the copy). Within the spread or worse: 4 or
// 16 rows ahead, prefetchnta, streaming stores with the whole-row prefetch, stopping at the head's
// end, heads interleaved between the threads, no software prefetch. Keep the line count a
// run-time value: the same prefetches with K = 128 known to GCC (8 unrolled prefetches) ran at
// 5.4-6.1 ms again, whether they came before the row's loads, after its stores or in a rolled
// loop; why is not understood.
constexpr int64_t kPrefetchRows = 8;

// Prefetch and store settings, read once from the environment (HDK_CPU_PREFETCH_ROWS,
// HDK_CPU_PREFETCH_LINES, HDK_CPU_STREAM_STORES); see the measurements above.
struct CpuTuning {
  int64_t rows = kPrefetchRows;  // rows ahead
  int64_t lines = 8;             // cache lines prefetched per row ahead
  bool stream = false;           // streaming stores for pools over kStreamingBytes
};

inline int64_t tuning_value(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr ? std::atoll(text) : fallback;
}

inline const CpuTuning& cpu_tuning() {
  static const CpuTuning tuning = [] {
    CpuTuning t;
    t.rows = tuning_value("HDK_CPU_PREFETCH_ROWS", t.rows);
    t.lines = tuning_value("HDK_CPU_PREFETCH_LINES", t.lines);
    t.stream = tuning_value("HDK_CPU_STREAM_STORES", t.stream ? 1 : 0) != 0;
    return t;
  }();
  return tuning;
}

// One row of the one-token step held in kVectors registers: read (and widened) once, dotted,
// updated and stored from the registers.
template <typename Vector, int64_t kVectors, typename Element>
HDK_BUILD_INLINE void step_row_in_registers(const Element* row, Element* target, bool stream,
                                            const float* k, const float* q, float decay, float beta,
                                            float v, float k_dot_q, float* out) {
  constexpr int64_t L = kLanes<Vector>;
  Vector r[kVectors];
  Vector dk[4] = {}, dq[4] = {};
#pragma GCC unroll 16
  for (int64_t a = 0; a < kVectors; ++a) {
    r[a] = load_vector<Vector>(row + a * L);
    dk[a % 4] += r[a] * load_vector<Vector>(k + a * L);
    dq[a % 4] += r[a] * load_vector<Vector>(q + a * L);
  }
  const float row_dot_k = sum_lanes((dk[0] + dk[1]) + (dk[2] + dk[3]));
  const float row_dot_q = sum_lanes((dq[0] + dq[1]) + (dq[2] + dq[3]));
  const float u = beta * (v - decay * row_dot_k);
  *out = decay * row_dot_q + u * k_dot_q;
  if (target == nullptr) return;
  if constexpr (Streams<Vector, Element>::value) {
    if (stream && reinterpret_cast<uintptr_t>(target) % (L * sizeof(Element)) == 0) {
#pragma GCC unroll 16
      for (int64_t a = 0; a < kVectors; ++a) {
        const Vector updated = decay * r[a] + u * load_vector<Vector>(k + a * L);
        stream_vector(target + a * L, updated);
      }
      return;
    }
  }
#pragma GCC unroll 16
  for (int64_t a = 0; a < kVectors; ++a)
    store_vector<Vector>(target + a * L, decay * r[a] + u * load_vector<Vector>(k + a * L));
}

// Layout kVK, one token, at most one state stored (the decode step's usual case): the rows are
// read where they lie, fp32 or bf16, and their update is stored straight to the target slot, in
// place or not; no staging copy. Rows of up to eight vectors stay in registers between their
// dots and their update (K = 128 with AVX-512); longer rows are read again from L1.
template <typename Vector, typename Element, int64_t kVectors>
HDK_BUILD_INLINE void step_rows(const DecodeProblem& p, int64_t target_slot, int64_t read_slot,
                                int64_t hv, Scratch& s) {
  const int64_t K = p.head_k;
  const int64_t V = p.head_v;
  const Element* source = static_cast<const Element*>(p.state) + slot_offset(p, read_slot, hv);
  Element* target =
      target_slot >= 0 ? static_cast<Element*>(p.state) + slot_offset(p, target_slot, hv) : nullptr;
  const float* k = s.k.data();
  const float* q = s.q.data();
  const float* v = s.v.data();
  float* out = s.out.data();
  const float decay = s.decay[0];
  const float beta = s.beta[0];
  const float k_dot_q = s.k_dot_q[0];
  const CpuTuning& tuning = cpu_tuning();
  const bool stream = tuning.stream && streams_state(p);
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(Element));
  for (int64_t i = 0; i < V; ++i) {
    const Element* row = source + i * K;
    Element* row_target = target != nullptr ? target + i * K : nullptr;
    // Past the head's last row this reaches into the next head of the slot, which the next task
    // usually reads; prefetches never fault.
    const Element* ahead = row + tuning.rows * K;
    for (int64_t l = 0; l < tuning.lines; ++l)
      __builtin_prefetch(ahead + l * kLine);
    if constexpr (kVectors > 0) {
      step_row_in_registers<Vector, kVectors>(row, row_target, stream, k, q, decay, beta, v[i],
                                              k_dot_q, out + i);
    } else {
      float row_dot_k;
      float row_dot_q;
      dot_two<Vector>(row, k, q, K, &row_dot_k, &row_dot_q);
      // o = S' q with S' = decay S + u k^T, i.e. decay (S q) + u (k.q): one pass for both dots.
      const float u = beta * (v[i] - decay * row_dot_k);
      out[i] = decay * row_dot_q + u * k_dot_q;
      if (row_target != nullptr) decay_and_add<Vector>(row, row_target, k, decay, u, K);
    }
  }
}

template <typename Vector, typename Element>
HDK_BUILD_INLINE void step_rows(const DecodeProblem& p, int64_t target_slot, int64_t read_slot,
                                int64_t hv, Scratch& s) {
  constexpr int64_t L = kLanes<Vector>;
  if (p.head_k == 8 * L) {
    step_rows<Vector, Element, 8>(p, target_slot, read_slot, hv, s);
  } else if (p.head_k == 4 * L) {
    step_rows<Vector, Element, 4>(p, target_slot, read_slot, hv, s);
  } else {
    step_rows<Vector, Element, 0>(p, target_slot, read_slot, hv, s);
  }
}

// Layout kVK, any number of tokens and stores: each row of S (one value index) evolves
// independently of the others, so rows stream through all tokens while they sit in L1, and
// every state byte moves once.
template <typename Vector, typename Bf16>
HDK_BUILD_INLINE void run_rows(const DecodeProblem& p, int64_t n, const RequestPlan& plan,
                               int64_t hv, Scratch& s) {
  const int64_t K = p.head_k;
  const int64_t V = p.head_v;
  const bool per_token = p.index_mode == IndexMode::kPerToken;
  if (plan.num_tokens == 1 && p.intermediate_states == nullptr) {
    const int64_t target_slot = per_token ? per_token_write_slot(p, n, 0) : plan.final_slot;
    if (p.state_dtype == DType::kFloat32) {
      step_rows<Vector, float>(p, target_slot, plan.read_slot, hv, s);
      return;
    }
    if (p.state_dtype == DType::kBFloat16) {
      step_rows<Vector, Bf16>(p, target_slot, plan.read_slot, hv, s);
      return;
    }
  }
  grow(s.row, K);
  const int64_t read_base = slot_offset(p, plan.read_slot, hv);
  // An fp32 pool updated in place with nothing else stored: the row is updated where it lies.
  const bool in_place = p.state_dtype == DType::kFloat32 && plan.final_slot == plan.read_slot &&
                        p.intermediate_states == nullptr && !per_token;
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
      dot_two<Vector>(row, k, q, K, &row_dot_k, &row_dot_q);
      const float u = s.beta[t] * (s.v[t * V + i] - decay * row_dot_k);
      s.out[t * V + i] = decay * row_dot_q + u * s.k_dot_q[t];
      decay_and_add<Vector>(row, row, k, decay, u, K);
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
HDK_BUILD_INLINE void run_matrix(const DecodeProblem& p, int64_t n, const RequestPlan& plan,
                                 int64_t hv, Scratch& s) {
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

// Returns whether the head was refused for a non-finite input.
template <typename Vector, typename Bf16>
HDK_BUILD_INLINE bool run_head(const DecodeProblem& p, int64_t n, int64_t hv) {
  const RequestPlan plan = plan_request(p, n);
  const int64_t row = p.variable_length ? 0 : n;
  const int64_t V = p.head_v;
  if (plan.read_slot < 0) {
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
      store_zeros(p.out.data, p.out.dtype, token_offset(p.out, row, plan.token_origin + t, hv), V);
    }
    return false;
  }
  Scratch& s = scratch();
  // A refused head runs its tokens before the first non-finite one, as a call of that many
  // tokens that stores no final state.
  RequestPlan run = plan;
  run.num_tokens = prepare_tokens<Vector>(p, row, plan.token_origin, plan.num_tokens, hv, s);
  const bool refused = run.num_tokens < plan.num_tokens;
  if (refused) run.final_slot = -1;
  if (run.num_tokens > 0) {
    if (p.layout == StateLayout::kVK) {
      run_rows<Vector, Bf16>(p, n, run, hv, s);
    } else {
      run_matrix(p, n, run, hv, s);
    }
  }
  for (int64_t t = 0; t < run.num_tokens; ++t) {
    store_floats(p.out.data, p.out.dtype, token_offset(p.out, row, plan.token_origin + t, hv), V,
                 s.out.data() + t * V);
  }
  if (refused) {
    std::fill(s.out.begin(), s.out.begin() + V, std::numeric_limits<float>::quiet_NaN());
    for (int64_t t = run.num_tokens; t < plan.num_tokens; ++t) {
      store_floats(p.out.data, p.out.dtype, token_offset(p.out, row, plan.token_origin + t, hv), V,
                   s.out.data());
    }
  }
  return refused;
}

// Bf16 is how one-token rows of a bf16 pool are stored: uint16_t (integer rounding) or NativeBf16.
// Returns the number of refused heads.
template <typename Vector, typename Bf16 = uint16_t>
HDK_BUILD_INLINE int64_t run_tasks(const DecodeProblem& p, int64_t begin, int64_t end) {
  const int64_t heads = p.num_v_heads;
  int64_t refused = 0;
  for (int64_t task = begin; task < end; ++task)
    refused += run_head<Vector, Bf16>(p, task / heads, task % heads) ? 1 : 0;
#ifdef HDK_GDN_CPU_X86_BUILDS
  _mm_sfence();  // the streaming stores are weakly ordered; the caller reads the state next
#endif
  return refused;
}

}  // namespace
}  // namespace detail
}  // namespace gdn
}  // namespace hdk
