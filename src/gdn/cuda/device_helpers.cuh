// Device-side pieces shared by the GDN decode kernels: element loads/stores in any input dtype,
// 16-byte state fragments, warp reductions, and the per-token preparation every CTA does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gdn/common_decode_problem.h"
#include "gdn/cuda/decode_launch.h"
#include "gdn/decode_problem.h"
#include "gdn/gating.h"

namespace hdk {
namespace gdn {
namespace detail {

// One scalar of q, k, v, a, b, g, beta or dt_bias: the dtype is uniform across the grid, so the
// switch costs a predictable branch, and it keeps one kernel per state type instead of one per
// input type (compile time, binary size).
__device__ __forceinline__ float load_element(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
    case DType::kFloat16:
      return __half2float(static_cast<const __half*>(base)[offset]);
    default:
      return static_cast<const float*>(base)[offset];
  }
}

__device__ __forceinline__ void store_element(void* base, DType dtype, int64_t offset,
                                              float value) {
  switch (dtype) {
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(base)[offset] = __float2bfloat16_rn(value);
      break;
    case DType::kFloat16:
      static_cast<__half*>(base)[offset] = __float2half_rn(value);
      break;
    default:
      static_cast<float*>(base)[offset] = value;
      break;
  }
}

// One 16-byte global store, written out: from a plain uint4 or float4 store the compiler made
// four 4-byte stores in some places (the short and general kernels' final state store), four
// times the store instructions and L2 write requests for the same bytes. The short kernel's final
// store uses it; elsewhere the plain store stays (Fragment::store): inside the token loops it
// already compiles to one instruction, and the asm, which pins the four words into one register
// quad, made instances of both the short and the general kernel spill.
__device__ __forceinline__ void store_16_bytes(void* target, uint32_t w0, uint32_t w1, uint32_t w2,
                                               uint32_t w3) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(target)),
               "r"(w0), "r"(w1), "r"(w2), "r"(w3));
}

// A 16-byte piece of a state row: 4 fp32 or 8 bf16 values, converted to fp32 registers.
template <typename StateT>
struct Fragment;

template <>
struct Fragment<float> {
  static constexpr int kSize = 4;
  __device__ __forceinline__ static void load(const float* source, float* values) {
    const float4 raw = __ldg(reinterpret_cast<const float4*>(source));
    values[0] = raw.x;
    values[1] = raw.y;
    values[2] = raw.z;
    values[3] = raw.w;
  }
  __device__ __forceinline__ static void store(float* target, const float* values) {
    *reinterpret_cast<float4*>(target) = make_float4(values[0], values[1], values[2], values[3]);
  }
  // The same as one 16-byte store instruction whatever the compiler would make of it.
  __device__ __forceinline__ static void store_vector(float* target, const float* values) {
    store_16_bytes(target, __float_as_uint(values[0]), __float_as_uint(values[1]),
                   __float_as_uint(values[2]), __float_as_uint(values[3]));
  }
};

template <>
struct Fragment<__nv_bfloat16> {
  static constexpr int kSize = 8;
  __device__ __forceinline__ static void load(const __nv_bfloat16* source, float* values) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(source));
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // bf16 -> fp32 is a 16-bit shift; no conversion instruction needed.
      values[2 * i] = __uint_as_float(words[i] << 16);
      values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
  __device__ __forceinline__ static void pack(const float* values, uint32_t* words) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(values[2 * i], values[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
  }
  __device__ __forceinline__ static void store(__nv_bfloat16* target, const float* values) {
    uint32_t words[4];
    pack(values, words);
    *reinterpret_cast<uint4*>(target) = make_uint4(words[0], words[1], words[2], words[3]);
  }
  // The same as one 16-byte store instruction whatever the compiler would make of it.
  __device__ __forceinline__ static void store_vector(__nv_bfloat16* target, const float* values) {
    uint32_t words[4];
    pack(values, words);
    store_16_bytes(target, words[0], words[1], words[2], words[3]);
  }
};

// Lanes that share one state row when each lane reads whole 16-byte fragments: K / (elements
// per fragment), at most a warp.
template <typename StateT, int K>
constexpr int full_lanes_per_row() {
  return full_lanes_per_row(static_cast<int>(sizeof(StateT)), K);
}

// A VK kernel's row tile: kRowsPerThread rows a thread, kLanes lanes a row, in 16-byte
// fragments.
template <typename StateT, int K, int kRowsPerThread, int kLanes = full_lanes_per_row<StateT, K>()>
struct VKShape {
  static constexpr int kVec = Fragment<StateT>::kSize;  // one 16-byte access per fragment
  static constexpr int kLanesPerRow = kLanes;
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes per row");
  static_assert(K % (kVec * kLanes) == 0, "a row is whole fragments per lane");
  static constexpr int kFragmentsPerLane = K / (kVec * kLanesPerRow);
  static constexpr int kValuesPerLane = kFragmentsPerLane * kVec;  // state floats per row
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;           // rows one warp load covers
  static constexpr int kRowsPerWarp = kRowsPerPass * kRowsPerThread;
};

// n contiguous elements of an input tensor (q or k) into fp32 registers: one vector load when
// the address allows it (views into packed buffers need not be aligned), scalars otherwise.
template <int kCount>
__device__ __forceinline__ void load_elements(const void* base, DType dtype, int64_t offset,
                                              float* values) {
  if (dtype == DType::kFloat32) {
    const float* source = static_cast<const float*>(base) + offset;
    if (kCount % 4 == 0 && reinterpret_cast<uintptr_t>(source) % 16 == 0) {
#pragma unroll
      for (int i = 0; i < kCount; i += 4) {
        const float4 raw = __ldg(reinterpret_cast<const float4*>(source + i));
        values[i] = raw.x;
        values[i + 1] = raw.y;
        values[i + 2] = raw.z;
        values[i + 3] = raw.w;
      }
      return;
    }
  } else {
    const uint16_t* source = static_cast<const uint16_t*>(base) + offset;
    const bool bf16 = dtype == DType::kBFloat16;
    if (kCount % 4 == 0 && reinterpret_cast<uintptr_t>(source) % 8 == 0) {
#pragma unroll
      for (int i = 0; i < kCount; i += 4) {
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(source + i));
        const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          if (bf16) {
            values[i + 2 * w] = __uint_as_float(words[w] << 16);
            values[i + 2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
          } else {
            const __half2 pair = *reinterpret_cast<const __half2*>(&words[w]);
            const float2 unpacked = __half22float2(pair);
            values[i + 2 * w] = unpacked.x;
            values[i + 2 * w + 1] = unpacked.y;
          }
        }
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    values[i] = load_element(base, dtype, offset + i);
}

// The raw bits of one input element (q, k, v, a, b, g or beta), to be converted by
// raw_to_float where it is used: a kernel that prefetches the next token's inputs must not
// convert them right after the load, or the warp would wait for the load right there.
__device__ __forceinline__ uint32_t load_raw_element(const void* base, DType dtype,
                                                     int64_t offset) {
  if (dtype == DType::kFloat32) return __ldg(static_cast<const unsigned int*>(base) + offset);
  return __ldg(static_cast<const unsigned short*>(base) + offset);
}

__device__ __forceinline__ float raw_to_float(uint32_t raw, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return __uint_as_float(raw << 16);
    case DType::kFloat16:
      return __half2float(__ushort_as_half(static_cast<unsigned short>(raw)));
    default:
      return __uint_as_float(raw);
  }
}

// The raw bits of kCount consecutive elements of q or k, 2 or 4 bytes each (the same
// deferred conversion as load_raw_element). Vector loads where the address allows them: a
// view into a packed buffer need not be aligned.
template <int kCount, int kElementBytes>
struct RawVector {
  static_assert(kElementBytes == 2 || kElementBytes == 4, "16-bit or 32-bit elements");
  static_assert(kCount % 2 == 0, "whole 32-bit words");
  static constexpr int kWords = kCount * kElementBytes / 4;
  uint32_t words[kWords];

  __device__ __forceinline__ void load(const void* base, int64_t offset) {
    const char* source = static_cast<const char*>(base) + offset * kElementBytes;
    const auto address = reinterpret_cast<uintptr_t>(source);
    if (kWords % 4 == 0 && address % 16 == 0) {
      load_words<4>(source);
    } else if (kWords % 2 == 0 && address % 8 == 0) {
      load_words<2>(source);
    } else if (address % 4 == 0) {
      load_words<1>(source);
    } else {
      // 16-bit elements at an odd 2-byte position.
      const unsigned short* halves = reinterpret_cast<const unsigned short*>(source);
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        words[i] = static_cast<uint32_t>(__ldg(halves + 2 * i)) |
                   (static_cast<uint32_t>(__ldg(halves + 2 * i + 1)) << 16);
      }
    }
  }

  // The same where the caller guarantees the address is a multiple of the piece's size (the
  // common form's q and k, common_decode_problem.h): one vector load, no alignment cases.
  __device__ __forceinline__ void load_aligned(const void* base, int64_t offset) {
    load_words<kWords % 4 == 0   ? 4
               : kWords % 2 == 0 ? 2
                                 : 1>(static_cast<const char*>(base) + offset * kElementBytes);
  }

  // The words as loads of kStep words each (16, 8 or 4 bytes) from an address aligned to them.
  template <int kStep>
  __device__ __forceinline__ void load_words(const char* source) {
    if constexpr (kWords % kStep == 0) {
#pragma unroll
      for (int i = 0; i < kWords; i += kStep) {
        if constexpr (kStep == 4) {
          const uint4 raw = __ldg(reinterpret_cast<const uint4*>(source) + i / 4);
          words[i] = raw.x;
          words[i + 1] = raw.y;
          words[i + 2] = raw.z;
          words[i + 3] = raw.w;
        } else if constexpr (kStep == 2) {
          const uint2 raw = __ldg(reinterpret_cast<const uint2*>(source) + i / 2);
          words[i] = raw.x;
          words[i + 1] = raw.y;
        } else {
          words[i] = __ldg(reinterpret_cast<const unsigned int*>(source) + i);
        }
      }
    }
  }

  __device__ __forceinline__ void to_float(DType dtype, float* values) const {
    if constexpr (kElementBytes == 4) {
#pragma unroll
      for (int i = 0; i < kCount; ++i)
        values[i] = __uint_as_float(words[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        if (dtype == DType::kBFloat16) {
          values[2 * i] = __uint_as_float(words[i] << 16);
          values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        } else {
          values[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i])));
          values[2 * i + 1] =
              __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] >> 16)));
        }
      }
    }
  }
};

// Sum over groups of `kWidth` consecutive lanes (a power of two <= 32); every lane of the
// group ends with the group's total.
template <int kWidth>
__device__ __forceinline__ float group_sum(float value) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sums kCount values over groups of kWidth consecutive lanes with a butterfly that halves the
// values each lane carries at every step (kCount - 1 shuffles instead of kCount * log2(kWidth)).
// On return values[0] holds the group's total of value index scattered_index(lane).
template <int kCount, int kOffset>
__device__ __forceinline__ void reduce_scatter_step(float* values, int lane_in_group) {
  // Compile-time recursion keeps every array index static (a runtime halving loop put the
  // values on the stack).
  if constexpr (kOffset >= 1) {
    if constexpr (kCount > 1) {
      const bool upper = (lane_in_group & kOffset) != 0;
#pragma unroll
      for (int i = 0; i < kCount / 2; ++i) {
        const float send = upper ? values[i] : values[i + kCount / 2];
        const float keep = upper ? values[i + kCount / 2] : values[i];
        values[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
      }
      reduce_scatter_step<kCount / 2, kOffset / 2>(values, lane_in_group);
    } else {
      values[0] += __shfl_xor_sync(0xffffffffu, values[0], kOffset);
      reduce_scatter_step<1, kOffset / 2>(values, lane_in_group);
    }
  }
}

template <int kCount, int kWidth>
__device__ __forceinline__ void reduce_scatter(float* values, int lane_in_group) {
  static_assert((kCount & (kCount - 1)) == 0 && (kWidth & (kWidth - 1)) == 0, "powers of two");
  reduce_scatter_step<kCount, kWidth / 2>(values, lane_in_group);
}

// The value index a lane holds after reduce_scatter<kCount, kWidth>.
template <int kCount, int kWidth>
__device__ __forceinline__ int scattered_index(int lane_in_group) {
  int index = 0, count = kCount;
#pragma unroll
  for (int offset = kWidth / 2; offset >= 1 && count > 1; offset /= 2) {
    if (lane_in_group & offset) index += count / 2;
    count /= 2;
  }
  return index;
}

// The lowest lane of a group that holds value `index` after reduce_scatter<kCount, kWidth>.
template <int kCount, int kWidth>
__device__ __forceinline__ int scattered_lane(int index) {
  int lane = 0, count = kCount;
#pragma unroll
  for (int offset = kWidth / 2; offset >= 1 && count > 1; offset /= 2) {
    if (index >= count / 2) {
      lane += offset;
      index -= count / 2;
    }
    count /= 2;
  }
  return lane;
}

__device__ __forceinline__ int64_t token_offset(const TokenTensor& x, int64_t request_row,
                                                int64_t token, int64_t head) {
  return request_row * x.stride_request + token * x.stride_token + head * x.stride_head;
}

// ---- non-finite inputs (docs/gdn-decode.md, "Non-finite inputs") ----

// Whether the raw bits of an element (load_raw_element) are a NaN or an infinity: its exponent
// is all ones. An integer test on the bits as loaded, so the check needs no conversion.
__device__ __forceinline__ bool raw_is_nonfinite(uint32_t raw, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return (raw & 0x7f80u) == 0x7f80u;
    case DType::kFloat16:
      return (raw & 0x7c00u) == 0x7c00u;
    default:
      return (raw & 0x7f800000u) == 0x7f800000u;
  }
}

// The same for kWords 32-bit words holding elements of `element_bytes` each (q, k as loaded).
template <int kWords>
__device__ __forceinline__ bool words_are_nonfinite(const uint32_t* words, int element_bytes,
                                                    DType dtype) {
  bool nonfinite = false;
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    if (element_bytes == 4) {
      nonfinite |= raw_is_nonfinite(words[w], dtype);
    } else {
      nonfinite |=
          raw_is_nonfinite(words[w] & 0xffffu, dtype) | raw_is_nonfinite(words[w] >> 16, dtype);
    }
  }
  return nonfinite;
}

// Whether a per-token tensor's rows of `row_elements` elements of `bytes` bytes (at any token,
// head and request) start on 8-byte boundaries and are whole 8-byte pieces. Tensor: TokenTensor
// or CompactTokenTensor (the same field names).
template <typename Tensor>
__device__ __forceinline__ bool rows_in_pieces(const Tensor& x, int bytes, int row_elements) {
  const uint64_t strides =
      static_cast<uint64_t>(x.stride_request) | static_cast<uint64_t>(x.stride_token) |
      static_cast<uint64_t>(x.stride_head) | static_cast<uint64_t>(row_elements);
  return ((reinterpret_cast<uintptr_t>(x.data) | strides * static_cast<uint64_t>(bytes)) % 8) == 0;
}

// Rows of `row_elements` elements (kBytes each, of `dtype`) starting at element offsets
// row_offset(t), t < count <= 32, tested for a NaN or an infinity by the whole warp: bit t of the
// result, on every lane, says whether row t holds one. The lanes spread over every (row, piece)
// pair, 8-byte pieces where the rows allow (`pieces`: rows_in_pieces), single elements otherwise.
template <int kBytes, typename RowOffset>
__device__ __forceinline__ uint32_t nonfinite_rows(const void* data, DType dtype,
                                                   RowOffset row_offset, int count,
                                                   int row_elements, bool pieces, int lane) {
  uint32_t rows = 0;
  if (pieces) {
    const int per_row = row_elements * kBytes / 8;
#pragma unroll 4
    for (int e = lane; e < count * per_row; e += 32) {
      const int t = count == 1 ? 0 : e / per_row;
      const uint2 piece =
          __ldg(reinterpret_cast<const uint2*>(static_cast<const char*>(data) +
                                               static_cast<int64_t>(row_offset(t)) * kBytes) +
                (e - t * per_row));
      const uint32_t words[2] = {piece.x, piece.y};
      if (words_are_nonfinite<2>(words, kBytes, dtype)) rows |= 1u << t;
    }
  } else {
#pragma unroll 4
    for (int e = lane; e < count * row_elements; e += 32) {
      const int t = count == 1 ? 0 : e / row_elements;
      const uint32_t raw = load_raw_element(
          data, dtype, static_cast<int64_t>(row_offset(t)) + (e - t * row_elements));
      if (raw_is_nonfinite(raw, dtype)) rows |= 1u << t;
    }
  }
  return __reduce_or_sync(0xffffffffu, rows);
}

// One token's whole v row, as 8-byte pieces spread over the lanes of a warp (piece i of lane l
// is bytes 8 (l + 32 i) ..): what the VK kernels load ahead with a token's other inputs so that
// every warp can refuse the head for a NaN or an infinity in any of its rows, though a lane
// loads only the row element it finishes. held() says whether a row fits: whole pieces on
// 8-byte boundaries, at most kPieces x 256 bytes; one that does not is tested with its own
// loads instead (nonfinite_rows; no preset has such a shape).
template <int kBytes, int kPieces>
struct RowPieces {
  uint2 pieces[kPieces];

  template <typename Tensor>
  __device__ __forceinline__ static bool held(const Tensor& x, int row_elements) {
    return rows_in_pieces(x, kBytes, row_elements) && row_elements * kBytes <= 256 * kPieces;
  }

  __device__ __forceinline__ void load(const void* data, int64_t offset, int row_elements,
                                       bool held, int lane) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int e = lane + 32 * i;
      pieces[i] = held && 8 * e < row_elements * kBytes
                      ? __ldg(reinterpret_cast<const uint2*>(static_cast<const char*>(data) +
                                                             offset * kBytes) +
                              e)
                      : make_uint2(0u, 0u);
    }
  }

  // This lane's share of the test (or, for a row not held, the warp's whole test).
  __device__ __forceinline__ bool nonfinite(const void* data, DType dtype, int64_t offset,
                                            int row_elements, bool held, int lane) const {
    if (!held) {
      return nonfinite_rows<kBytes>(
                 data, dtype, [&](int) { return offset; }, 1, row_elements, false, lane) != 0;
    }
    bool found = false;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const uint32_t words[2] = {pieces[i].x, pieces[i].y};
      found |= words_are_nonfinite<2>(words, kBytes, dtype);
    }
    return found;
  }
};

// Everything one token contributes to a head, in shared memory for all of the CTA's threads.
template <int K>
struct alignas(16) TokenVectors {
  float q[K];  // l2-normalized (optional) and scaled
  float k[K];  // l2-normalized (optional)
  float decay;
  float beta;
  float k_dot_q;
  int nonfinite;  // a NaN or an infinity among the token's inputs of the head (q, k, v, gates)
};

// A token's raw inputs as one warp loads them: K / 32 elements of q and k per lane, and the
// gate inputs in lane 0. Loading is split from finishing so a kernel can issue these loads
// together with the pool loads and pay one DRAM round trip for all of them.
template <int K>
struct TokenInputs {
  static constexpr int kPerLane = K / 32;
  float q[kPerLane];
  float k[kPerLane];
  float gate_a;  // a (fused gating) or g
  float gate_b;  // b (fused gating) or beta
  float dt_bias;
  float A_log;
  // The head's whole v row as raw 8-byte pieces (piece i of lane l: bytes 8 (l + 32 i) ..), for
  // the non-finite test; rows of up to 512 bytes on 8-byte boundaries (v_row_held).
  uint2 v_row[2];
};

// Whether load_token_inputs holds a token's whole v row in TokenInputs::v_row.
__device__ __forceinline__ bool v_row_held(const DecodeProblem& p) {
  const int bytes = p.v.dtype == DType::kFloat32 ? 4 : 2;
  return rows_in_pieces(p.v, bytes, static_cast<int>(p.head_v)) && p.head_v * bytes <= 512;
}

// hold_v_row: load the token's v row into in.v_row (where v_row_held) for token_v_nonfinite;
// without it, v_row_nonfinite tests the row with loads of its own.
template <int K>
__device__ __forceinline__ void load_token_inputs(const DecodeProblem& p, int64_t request_row,
                                                  int64_t token, int64_t hv, int lane,
                                                  TokenInputs<K>& in, bool hold_v_row) {
  const int64_t h = p.qk_head_of(hv);
  if (lane == 0) {
    const TokenTensor& a = p.fused_gating ? p.a : p.g;
    const TokenTensor& b = p.fused_gating ? p.b : p.beta;
    in.gate_a = load_element(a.data, a.dtype, token_offset(a, request_row, token, hv));
    in.gate_b = load_element(b.data, b.dtype, token_offset(b, request_row, token, hv));
    if (p.fused_gating) {
      in.dt_bias = load_element(p.dt_bias, p.dt_bias_dtype, hv * p.dt_bias_stride);
      in.A_log = p.A_log[hv * p.A_log_stride];
    }
  }
  const int64_t q_base = token_offset(p.q, request_row, token, h);
  const int64_t k_base = token_offset(p.k, request_row, token, h);
#pragma unroll
  for (int i = 0; i < TokenInputs<K>::kPerLane; ++i) {
    const int j = i * 32 + lane;  // lane-interleaved: coalesced loads, conflict-free stores
    in.q[i] = load_element(p.q.data, p.q.dtype, q_base + j);
    in.k[i] = load_element(p.k.data, p.k.dtype, k_base + j);
  }
  const int64_t v_bytes = p.head_v * (p.v.dtype == DType::kFloat32 ? 4 : 2);
  const bool held = hold_v_row && v_row_held(p);
  const char* v_row = static_cast<const char*>(p.v.data) +
                      token_offset(p.v, request_row, token, hv) * (v_bytes / p.head_v);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int e = lane + 32 * i;
    in.v_row[i] = held && 8 * e < v_bytes ? __ldg(reinterpret_cast<const uint2*>(v_row) + e)
                                          : make_uint2(0u, 0u);
  }
}

// Whether the v row at element offset v_offset holds a NaN or an infinity: the warp's test, with
// element loads of its own that it consumes at once. (Its 8-byte-piece form, with a branch per
// element size, took more registers than these loads save.)
__device__ __forceinline__ bool v_row_nonfinite(const DecodeProblem& p, int64_t v_offset,
                                                int lane) {
  return nonfinite_rows<2>(
             p.v.data, p.v.dtype, [&](int) { return v_offset; }, 1, static_cast<int>(p.head_v),
             false, lane) != 0;
}

// Whether the token's whole v row (this lane's share of it, in.v_row, as load_token_inputs held
// it; for a row not held there, v_row_nonfinite) holds a NaN or an infinity.
template <int K>
__device__ __forceinline__ bool token_v_nonfinite(const DecodeProblem& p, const TokenInputs<K>& in,
                                                  int64_t v_offset, int lane) {
  if (!v_row_held(p)) return v_row_nonfinite(p, v_offset, lane);
  const int bytes = p.v.dtype == DType::kFloat32 ? 4 : 2;
  bool nonfinite = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t words[2] = {in.v_row[i].x, in.v_row[i].y};
    nonfinite |= words_are_nonfinite<2>(words, bytes, p.v.dtype);
  }
  return nonfinite;
}

// Normalizes and scales q and k, computes the gate, and writes the token's vectors, with whether
// any of the token's inputs is a NaN or an infinity. v_nonfinite: this lane's share of
// token_v_nonfinite (a kernel may test the v row early, so that its pieces hold no registers
// later).
template <int K>
__device__ __forceinline__ void finish_token(const DecodeProblem& p, const TokenInputs<K>& in,
                                             bool v_nonfinite, int lane, TokenVectors<K>& out) {
  float qq = 0.0f, kk = 0.0f, qk = 0.0f;
#pragma unroll
  for (int i = 0; i < TokenInputs<K>::kPerLane; ++i) {
    qq += in.q[i] * in.q[i];
    kk += in.k[i] * in.k[i];
    qk += in.q[i] * in.k[i];
  }
  float q_factor = p.scale;
  float k_factor = 1.0f;
  if (p.use_qk_l2norm) {
    q_factor *= rsqrtf(group_sum<32>(qq) + p.l2norm_eps);
    k_factor = rsqrtf(group_sum<32>(kk) + p.l2norm_eps);
  }
  qk = group_sum<32>(qk);
#pragma unroll
  for (int i = 0; i < TokenInputs<K>::kPerLane; ++i) {
    out.q[i * 32 + lane] = in.q[i] * q_factor;
    out.k[i * 32 + lane] = in.k[i] * k_factor;
  }
  bool nonfinite = v_nonfinite || (lane == 0 && !(isfinite(in.gate_a) && isfinite(in.gate_b)));
#pragma unroll
  for (int i = 0; i < TokenInputs<K>::kPerLane; ++i)
    nonfinite |= !(isfinite(in.q[i]) && isfinite(in.k[i]));
  nonfinite = __any_sync(0xffffffffu, nonfinite);
  if (lane == 0) {
    const float g = p.fused_gating ? fused_log_decay(in.A_log, in.gate_a, in.dt_bias,
                                                     p.softplus_beta, p.softplus_threshold)
                                   : in.gate_a;
    out.decay = expf(g);
    out.beta = p.fused_gating ? sigmoid(in.gate_b) : in.gate_b;
    out.k_dot_q = qk * q_factor * k_factor;
    out.nonfinite = nonfinite ? 1 : 0;
  }
}

// Which tokens request n owns, without reading any pool index (cu_seqlens only).
struct TokenRange {
  int64_t origin = 0;
  int64_t count = 0;
};

__device__ __forceinline__ TokenRange request_tokens(const DecodeProblem& p, int64_t n) {
  TokenRange range;
  if (!p.variable_length) {
    range.count = p.tokens_per_request;
    return range;
  }
  const int64_t begin = p.cu_seqlens.at(n);
  const int64_t end = p.cu_seqlens.at(n + 1);
  // A malformed range is handled by plan_request; here it only must not address wild memory.
  if (begin >= 0 && end >= begin && end <= p.total_tokens) {
    range.origin = begin;
    range.count = end - begin;
  }
  return range;
}

// The common form's fixed-length requests are all of one length.
__device__ __forceinline__ TokenRange request_tokens(const CommonDecodeProblem& p, int64_t) {
  TokenRange range;
  range.count = p.tokens_per_request;
  return range;
}

// A decode step's request: its cu_seqlens range, checked like DecodeProblem's above.
__device__ __forceinline__ TokenRange request_tokens(const CommonDecodeStepProblem& p, int64_t n) {
  TokenRange range;
  const int64_t begin = p.cu_seqlens[n * p.cu_seqlens_stride];
  const int64_t end = p.cu_seqlens[(n + 1) * p.cu_seqlens_stride];
  if (begin >= 0 && end >= begin && end <= p.total_tokens) {
    range.origin = begin;
    range.count = end - begin;
  }
  return range;
}

// Adds 1 to an optional [1] int32/int64 counter of the call.
__device__ __forceinline__ void add_one(void* counter, DType dtype) {
  if (counter == nullptr) return;
  if (dtype == DType::kInt64) {
    atomicAdd(static_cast<unsigned long long*>(counter), 1ull);
  } else {
    atomicAdd(static_cast<int*>(counter), 1);
  }
}

// Problem: DecodeProblem or CommonDecodeProblem (the same field names).
template <typename Problem>
__device__ __forceinline__ void count_invalid(const Problem& p) {
  add_one(p.invalid_index_count, p.invalid_index_count_dtype);
}

// Adds 1 to the counter of refused heads; one lane of one warp per refused (request, head).
template <typename Problem>
__device__ __forceinline__ void count_refused_head(const Problem& p) {
  add_one(p.nonfinite_head_count, p.nonfinite_head_count_dtype);
}

// The first of tokens origin .. origin + count - 1 of one (request, value head) with a NaN or an
// infinity among its inputs (q and k of its query/key head, its v, its two gate inputs), as an
// offset from origin, on every lane; count when there is none. For the kernels that do not check
// the inputs as they load them (kKV, the one-token sweep kernel): 32 tokens at a time, each a
// single round of loads.
__device__ __forceinline__ int64_t first_nonfinite_token(const DecodeProblem& p,
                                                         int64_t request_row, int64_t origin,
                                                         int64_t count, int64_t hv, int lane) {
  const TokenTensor& gate_a = p.fused_gating ? p.a : p.g;
  const TokenTensor& gate_b = p.fused_gating ? p.b : p.beta;
  const int64_t h = p.qk_head_of(hv);
  const DType input = p.q.dtype;  // k and v share it (validated)
  const int bytes = input == DType::kFloat32 ? 4 : 2;
  const int head_k = static_cast<int>(p.head_k), head_v = static_cast<int>(p.head_v);
  for (int64_t window = 0; window < count; window += 32) {
    const int tokens = static_cast<int>(count - window < 32 ? count - window : 32);
    const int64_t first = origin + window;
    auto rows = [&](const TokenTensor& x, int64_t head, int elements) {
      auto row_offset = [&](int t) { return token_offset(x, request_row, first + t, head); };
      const bool pieces = rows_in_pieces(x, bytes, elements);
      return bytes == 4
                 ? nonfinite_rows<4>(x.data, input, row_offset, tokens, elements, pieces, lane)
                 : nonfinite_rows<2>(x.data, input, row_offset, tokens, elements, pieces, lane);
    };
    bool gate_bad = false;
    if (lane < tokens) {
      gate_bad =
          raw_is_nonfinite(load_raw_element(gate_a.data, gate_a.dtype,
                                            token_offset(gate_a, request_row, first + lane, hv)),
                           gate_a.dtype) ||
          raw_is_nonfinite(load_raw_element(gate_b.data, gate_b.dtype,
                                            token_offset(gate_b, request_row, first + lane, hv)),
                           gate_b.dtype);
    }
    const uint32_t bad = rows(p.q, h, head_k) | rows(p.k, h, head_k) | rows(p.v, hv, head_v) |
                         __ballot_sync(0xffffffffu, gate_bad);
    if (bad != 0) return window + __ffs(static_cast<int>(bad)) - 1;
  }
  return count;
}

template <typename Problem>
__device__ __forceinline__ int64_t slot_offset(const Problem& p, int64_t slot, int64_t hv) {
  return slot * p.slot_pitch + hv * p.head_pitch;
}

template <typename Problem>
__device__ __forceinline__ int64_t cache_offset(const Problem& p, int64_t n, int64_t t,
                                                int64_t hv) {
  return n * p.intermediate_stride_request + t * p.intermediate_stride_token + hv * p.head_pitch;
}

// Where the state after token t of request n goes besides the final slot: the verify cache and
// the per-token pool slot of 2-D state_indices (nullptr where not asked for).
template <typename StateT>
struct TokenStateTargets {
  StateT* cache;
  StateT* token_slot;
};

template <typename StateT>
__device__ __forceinline__ TokenStateTargets<StateT> token_state_targets(const DecodeProblem& p,
                                                                         int64_t n, int64_t t,
                                                                         int64_t hv) {
  const int64_t slot = per_token_write_slot(p, n, t);
  return {p.intermediate_states != nullptr
              ? static_cast<StateT*>(p.intermediate_states) + cache_offset(p, n, t, hv)
              : nullptr,
          slot >= 0 ? static_cast<StateT*>(p.state) + slot_offset(p, slot, hv) : nullptr};
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
