#include "gdn/reference/decode_reference.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/float_convert.h"
#include "gdn/decode_validation.h"
#include "hdk/error.h"

namespace hdk {
namespace gdn {
namespace {

int64_t offset_of(const TensorView& view, std::initializer_list<int64_t> index) {
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : index)
    offset += i * view.strides[d++];
  return offset;
}

double load(const TensorView& view, std::initializer_list<int64_t> index) {
  const int64_t offset = offset_of(view, index);
  switch (view.dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(view.data)[offset];
    case DType::kBFloat16:
      return hdk::detail::bf16_to_float(static_cast<const uint16_t*>(view.data)[offset]);
    case DType::kFloat16:
      return hdk::detail::half_to_float(static_cast<const uint16_t*>(view.data)[offset]);
    case DType::kInt32:
      return static_cast<const int32_t*>(view.data)[offset];
    case DType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(view.data)[offset]);
    case DType::kUInt8:
      return static_cast<const uint8_t*>(view.data)[offset];
  }
  return 0.0;
}

int64_t load_index(const TensorView& view, std::initializer_list<int64_t> index) {
  const int64_t offset = offset_of(view, index);
  if (view.dtype == DType::kInt64) return static_cast<const int64_t*>(view.data)[offset];
  return static_cast<const int32_t*>(view.data)[offset];
}

void store(const TensorView& view, std::initializer_list<int64_t> index, double value) {
  const int64_t offset = offset_of(view, index);
  const auto rounded = static_cast<float>(value);
  switch (view.dtype) {
    case DType::kFloat32:
      static_cast<float*>(view.data)[offset] = rounded;
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(view.data)[offset] = hdk::detail::float_to_bf16(rounded);
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(view.data)[offset] = hdk::detail::float_to_half(rounded);
      break;
    case DType::kInt32:
      static_cast<int32_t*>(view.data)[offset] = static_cast<int32_t>(value);
      break;
    case DType::kInt64:
      static_cast<int64_t*>(view.data)[offset] = static_cast<int64_t>(value);
      break;
    case DType::kUInt8:
      break;
  }
}

// One head's state as a V x K matrix S[i][j], whatever the storage layout.
struct HeadState {
  int64_t V, K;
  std::vector<double> values;
  double& at(int64_t i, int64_t j) { return values[i * K + j]; }
};

// state-like view: [slots, HV, V, K] (kVK) or [slots, HV, K, V] (kKV); `extra` prefixes the
// intermediate cache's [n, t] index.
void load_head(const TensorView& pool, bool vk, int64_t slot, int64_t head, HeadState& S) {
  for (int64_t i = 0; i < S.V; ++i) {
    for (int64_t j = 0; j < S.K; ++j) {
      S.at(i, j) = vk ? load(pool, {slot, head, i, j}) : load(pool, {slot, head, j, i});
    }
  }
}

void store_head(const TensorView& pool, bool vk, int64_t slot, int64_t head, HeadState& S) {
  for (int64_t i = 0; i < S.V; ++i) {
    for (int64_t j = 0; j < S.K; ++j) {
      if (vk) {
        store(pool, {slot, head, i, j}, S.at(i, j));
      } else {
        store(pool, {slot, head, j, i}, S.at(i, j));
      }
    }
  }
}

void store_cached_head(const TensorView& cache, bool vk, int64_t n, int64_t t, int64_t head,
                       HeadState& S) {
  for (int64_t i = 0; i < S.V; ++i) {
    for (int64_t j = 0; j < S.K; ++j) {
      if (vk) {
        store(cache, {n, t, head, i, j}, S.at(i, j));
      } else {
        store(cache, {n, t, head, j, i}, S.at(i, j));
      }
    }
  }
}

}  // namespace

void decode_reference(const DecodeParams& p) {
  const detail::DecodeProblem problem = detail::validate_decode(p);
  if (!p.q.device.is_cpu()) throw Error("hdk::gdn::decode_reference: tensors must be on the CPU");

  const bool varlen = p.cu_seqlens.defined();
  const bool vk = p.layout == StateLayout::kVK;
  const int64_t B = varlen ? p.cu_seqlens.shape[0] - 1 : p.q.shape[0];
  const int64_t total = varlen ? p.q.shape[1] : 0;
  const int64_t H = p.q.shape[2], K = p.q.shape[3];
  const int64_t HV = p.v.shape[2], V = p.v.shape[3];
  const int64_t P = p.state.shape[0];
  const bool per_token = p.state_indices.defined() && p.state_indices.ndim == 2;
  int64_t capacity = varlen ? total : p.q.shape[1];
  if (per_token && p.state_indices.shape[1] < capacity) capacity = p.state_indices.shape[1];
  if (p.intermediate_states.defined() && p.intermediate_states.shape[1] < capacity) {
    capacity = p.intermediate_states.shape[1];
  }
  if (varlen && p.max_tokens_per_request > 0 && p.max_tokens_per_request < capacity) {
    capacity = p.max_tokens_per_request;
  }
  const double scale = p.scale != 0.0f ? p.scale : 1.0 / std::sqrt(static_cast<double>(K));
  int64_t invalid_requests = 0;
  int64_t refused_heads = 0;

  HeadState S{V, K, std::vector<double>(static_cast<size_t>(V * K))};
  std::vector<double> qn(K), kn(K), u(V);

  for (int64_t n = 0; n < B; ++n) {
    // Which tokens the request owns, as (dim 0, dim 1) coordinates of the per-token tensors.
    int64_t first = 0, count = p.q.shape[1];
    if (varlen) {
      const int64_t begin = load_index(p.cu_seqlens, {n});
      const int64_t end = load_index(p.cu_seqlens, {n + 1});
      if (begin < 0 || end < begin || end > total || end - begin > capacity) {
        ++invalid_requests;
        continue;
      }
      first = begin;
      count = end - begin;
    }
    const int64_t row = varlen ? 0 : n;
    if (count == 0) continue;

    // Slots: one read, and either one final write or one write per token.
    bool invalid = false;
    int64_t read_slot;
    std::vector<int64_t> writes;  // per token (per_token) or a single final slot
    if (!p.state_indices.defined()) {
      read_slot = n;
    } else if (!per_token) {
      read_slot = load_index(p.state_indices, {n});
    } else {
      int64_t column = 0;
      if (p.num_accepted_tokens.defined()) {
        const int64_t accepted = load_index(p.num_accepted_tokens, {n});
        invalid = accepted < 1 || accepted > p.state_indices.shape[1];
        column = invalid ? 0 : accepted - 1;
      }
      read_slot = load_index(p.state_indices, {n, column});
    }
    const bool padding = !invalid && read_slot < 0;
    if (!invalid && !padding) {
      invalid = read_slot >= P;
      if (p.update_state) {
        if (per_token) {
          for (int64_t t = 0; t < count; ++t)
            writes.push_back(load_index(p.state_indices, {n, t}));
        } else {
          writes.push_back(p.output_state_indices.defined()
                               ? load_index(p.output_state_indices, {n})
                               : read_slot);
        }
        for (int64_t slot : writes)
          invalid = invalid || slot >= P;
      }
    }
    if (invalid) ++invalid_requests;
    if (invalid || padding) {
      for (int64_t t = 0; t < count; ++t) {
        for (int64_t hv = 0; hv < HV; ++hv) {
          for (int64_t i = 0; i < V; ++i)
            store(p.out, {row, first + t, hv, i}, 0.0);
        }
      }
      continue;
    }

    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t h = hv / (HV / H);
      // The head runs up to its first token with a NaN or an infinity among its inputs; from
      // that token on its outputs are NaN and no state is stored (docs/gdn-decode.md).
      int64_t good = count;
      for (int64_t t = 0; t < count && good == count; ++t) {
        const int64_t tok = first + t;
        const TensorView& gate_a = problem.fused_gating ? p.a : p.g;
        const TensorView& gate_b = problem.fused_gating ? p.b : p.beta;
        bool finite = std::isfinite(load(gate_a, {row, tok, hv})) &&
                      std::isfinite(load(gate_b, {row, tok, hv}));
        for (int64_t j = 0; j < K; ++j) {
          finite = finite && std::isfinite(load(p.q, {row, tok, h, j})) &&
                   std::isfinite(load(p.k, {row, tok, h, j}));
        }
        for (int64_t i = 0; i < V; ++i)
          finite = finite && std::isfinite(load(p.v, {row, tok, hv, i}));
        if (!finite) good = t;
      }
      if (good < count) {
        ++refused_heads;
        for (int64_t t = good; t < count; ++t) {
          for (int64_t i = 0; i < V; ++i)
            store(p.out, {row, first + t, hv, i}, std::nan(""));
        }
      }
      load_head(p.state, vk, read_slot, hv, S);
      for (int64_t t = 0; t < good; ++t) {
        const int64_t tok = first + t;
        double g, beta;
        if (problem.fused_gating) {
          const double x = load(p.a, {row, tok, hv}) + load(p.dt_bias, {hv});
          const double bx = static_cast<double>(p.softplus_beta) * x;
          const double softplus =
              bx > p.softplus_threshold ? x : std::log1p(std::exp(bx)) / p.softplus_beta;
          g = -std::exp(load(p.A_log, {hv})) * softplus;
          beta = 1.0 / (1.0 + std::exp(-load(p.b, {row, tok, hv})));
        } else {
          g = load(p.g, {row, tok, hv});
          beta = load(p.beta, {row, tok, hv});
        }
        double qq = 0.0, kk = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          qn[j] = load(p.q, {row, tok, h, j});
          kn[j] = load(p.k, {row, tok, h, j});
          qq += qn[j] * qn[j];
          kk += kn[j] * kn[j];
        }
        const double q_factor = p.use_qk_l2norm ? scale / std::sqrt(qq + p.l2norm_eps) : scale;
        const double k_factor = p.use_qk_l2norm ? 1.0 / std::sqrt(kk + p.l2norm_eps) : 1.0;
        for (int64_t j = 0; j < K; ++j) {
          qn[j] *= q_factor;
          kn[j] *= k_factor;
        }
        const double decay = std::exp(g);
        for (double& s : S.values)
          s *= decay;
        for (int64_t i = 0; i < V; ++i) {
          double sk = 0.0;
          for (int64_t j = 0; j < K; ++j)
            sk += S.at(i, j) * kn[j];
          u[i] = beta * (load(p.v, {row, tok, hv, i}) - sk);
        }
        for (int64_t i = 0; i < V; ++i) {
          for (int64_t j = 0; j < K; ++j)
            S.at(i, j) += u[i] * kn[j];
        }
        for (int64_t i = 0; i < V; ++i) {
          double o = 0.0;
          for (int64_t j = 0; j < K; ++j)
            o += S.at(i, j) * qn[j];
          store(p.out, {row, tok, hv, i}, o);
        }
        if (p.intermediate_states.defined()) {
          store_cached_head(p.intermediate_states, vk, n, t, hv, S);
        }
        if (per_token && p.update_state && writes[t] >= 0) {
          store_head(p.state, vk, writes[t], hv, S);
        }
      }
      if (!per_token && p.update_state && writes[0] >= 0 && good == count) {
        store_head(p.state, vk, writes[0], hv, S);
      }
    }
  }

  if (p.invalid_index_count.defined()) {
    store(p.invalid_index_count, {}, load(p.invalid_index_count, {}) + invalid_requests);
  }
  if (p.nonfinite_head_count.defined()) {
    store(p.nonfinite_head_count, {}, load(p.nonfinite_head_count, {}) + refused_heads);
  }
}

}  // namespace gdn
}  // namespace hdk
