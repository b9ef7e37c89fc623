// torch.ops.hdk.dsv4_store_entries, dsv4_gather_entries, dsv4_store_indexer_keys,
// dsv4_gather_indexer_keys, dsv4_compress, dsv4_compress_pair, dsv4_store_and_compress and
// dsv4_store_and_compress_pair: the DeepSeek-V4 KV cache operations as torch custom ops that write
// in place and return nothing (capturable in CUDA graphs). Argument names match the C++ params
// structs; key_format is 0 (MXFP4), 1 (NVFP4) or 2 (FP8) (torch_glue.h's key_format).
// hdk/dsv4/ops.py wraps them.
#include <torch/library.h>

#include <cstdint>

#include "hdk/dsv4/block_allocator.h"
#include "hdk/dsv4/kv_cache.h"
#include "torch_glue.h"

namespace hdk_python {
namespace {

template <bool kMeta>
void store_entries(const at::Tensor& values, const at::Tensor& slots, const at::Tensor& cache,
                   int64_t block_size, const OptionalTensor& invalid_count, bool check_indices) {
  CallViews views("hdk::dsv4::store_entries", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::StoreEntriesParams p;
    p.values = views(values, "values");
    p.slots = views(slots, "slots");
    p.cache = views(cache, "cache");
    p.block_size = block_size;
    p.invalid_count = views(invalid_count, "invalid_count");
    p.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(cache);
    hdk::dsv4::store_entries(p, current_stream(cache));
  });
}

template <bool kMeta>
void gather_entries(const at::Tensor& cache, int64_t block_size, const at::Tensor& slots,
                    const at::Tensor& out, const OptionalTensor& invalid_count,
                    bool check_indices) {
  CallViews views("hdk::dsv4::gather_entries", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::GatherEntriesParams p;
    p.cache = views(cache, "cache");
    p.block_size = block_size;
    p.slots = views(slots, "slots");
    p.out = views(out, "out");
    p.invalid_count = views(invalid_count, "invalid_count");
    p.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(out);
    hdk::dsv4::gather_entries(p, current_stream(out));
  });
}

template <bool kMeta>
void store_indexer_keys(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& cache,
                        int64_t block_size, int64_t format, bool rotate,
                        const OptionalTensor& invalid_count, bool check_indices) {
  CallViews views("hdk::dsv4::store_indexer_keys", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::StoreIndexerKeysParams p;
    p.keys = views(keys, "keys");
    p.slots = views(slots, "slots");
    p.cache = views(cache, "cache");
    p.block_size = block_size;
    p.format = key_format(format, "hdk::dsv4::store_indexer_keys", "format");
    p.rotate = rotate;
    p.invalid_count = views(invalid_count, "invalid_count");
    p.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(cache);
    hdk::dsv4::store_indexer_keys(p, current_stream(cache));
  });
}

template <bool kMeta>
void gather_indexer_keys(const at::Tensor& cache, int64_t block_size, const at::Tensor& slots,
                         const at::Tensor& out, int64_t format, const OptionalTensor& invalid_count,
                         bool check_indices) {
  CallViews views("hdk::dsv4::gather_indexer_keys", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::GatherIndexerKeysParams p;
    p.cache = views(cache, "cache");
    p.block_size = block_size;
    p.slots = views(slots, "slots");
    p.out = views(out, "out");
    p.format = key_format(format, "hdk::dsv4::gather_indexer_keys", "format");
    p.invalid_count = views(invalid_count, "invalid_count");
    p.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(out);
    hdk::dsv4::gather_indexer_keys(p, current_stream(out));
  });
}

// One compress call's tensors and options as the op takes them.
struct CompressArguments {
  const at::Tensor &kv, &score, &ape, &positions, &state_slots, &state, &norm_weight, &rope_cos,
      &rope_sin, &block_table, &cache;
  int64_t block_size, ratio;
  double norm_eps;
  int64_t key_format;
  bool rotate;
};

// The call's params; `names` name its arguments in the glue's errors (the second call of a pair
// takes "kv2", ...).
hdk::dsv4::CompressorParams compressor_params(CallViews& views, const CompressArguments& a,
                                              const char* const (&names)[12]) {
  hdk::dsv4::CompressorParams p;
  p.kv = views(a.kv, names[0]);
  p.score = views(a.score, names[1]);
  p.ape = views(a.ape, names[2]);
  p.positions = views(a.positions, names[3]);
  p.state_slots = views(a.state_slots, names[4]);
  p.state = views(a.state, names[5]);
  p.norm_weight = views(a.norm_weight, names[6]);
  p.rope_cos = views(a.rope_cos, names[7]);
  p.rope_sin = views(a.rope_sin, names[8]);
  p.block_table = views(a.block_table, names[9]);
  p.cache = views(a.cache, names[10]);
  p.block_size = a.block_size;
  p.ratio = a.ratio;
  p.norm_eps = static_cast<float>(a.norm_eps);
  p.key_format = key_format(a.key_format, "hdk::dsv4::compress", names[11]);
  p.rotate = a.rotate;
  return p;
}

constexpr const char* kFirstCall[12] = {"kv",          "score",       "ape",         "positions",
                                        "state_slots", "state",       "norm_weight", "rope_cos",
                                        "rope_sin",    "block_table", "cache",       "key_format"};
constexpr const char* kSecondCall[12] = {
    "kv2",          "score2",    "ape2",      "positions2",   "state_slots2", "state2",
    "norm_weight2", "rope_cos2", "rope_sin2", "block_table2", "cache2",       "key_format2"};

template <bool kMeta>
void compress(const at::Tensor& kv, const at::Tensor& score, const at::Tensor& ape,
              const at::Tensor& positions, const at::Tensor& state_slots, const at::Tensor& state,
              const at::Tensor& norm_weight, const at::Tensor& rope_cos, const at::Tensor& rope_sin,
              const at::Tensor& block_table, const at::Tensor& cache, int64_t block_size,
              int64_t ratio, double norm_eps, int64_t key_format_value, bool rotate,
              const OptionalTensor& invalid_count, bool check_indices) {
  CallViews views("hdk::dsv4::compress", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::CompressorParams p = compressor_params(
        views,
        {kv, score, ape, positions, state_slots, state, norm_weight, rope_cos, rope_sin,
         block_table, cache, block_size, ratio, norm_eps, key_format_value, rotate},
        kFirstCall);
    p.invalid_count = views(invalid_count, "invalid_count");
    p.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(state);
    hdk::dsv4::compress(p, current_stream(state));
  });
}

// A CSA layer's two compressor calls in one launch (hdk::dsv4::compress with two calls): each
// call's tensors and options in the order of dsv4_compress, one counter and one check option for
// both.
template <bool kMeta>
void compress_pair(const at::Tensor& kv, const at::Tensor& score, const at::Tensor& ape,
                   const at::Tensor& positions, const at::Tensor& state_slots,
                   const at::Tensor& state, const at::Tensor& norm_weight,
                   const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                   const at::Tensor& block_table, const at::Tensor& cache, int64_t block_size,
                   int64_t ratio, double norm_eps, int64_t key_format_value, bool rotate,
                   const at::Tensor& kv2, const at::Tensor& score2, const at::Tensor& ape2,
                   const at::Tensor& positions2, const at::Tensor& state_slots2,
                   const at::Tensor& state2, const at::Tensor& norm_weight2,
                   const at::Tensor& rope_cos2, const at::Tensor& rope_sin2,
                   const at::Tensor& block_table2, const at::Tensor& cache2, int64_t block_size2,
                   int64_t ratio2, double norm_eps2, int64_t key_format_value2, bool rotate2,
                   const OptionalTensor& invalid_count, bool check_indices) {
  CallViews views("hdk::dsv4::compress", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::CompressorParams first = compressor_params(
        views,
        {kv, score, ape, positions, state_slots, state, norm_weight, rope_cos, rope_sin,
         block_table, cache, block_size, ratio, norm_eps, key_format_value, rotate},
        kFirstCall);
    hdk::dsv4::CompressorParams second = compressor_params(
        views,
        {kv2, score2, ape2, positions2, state_slots2, state2, norm_weight2, rope_cos2, rope_sin2,
         block_table2, cache2, block_size2, ratio2, norm_eps2, key_format_value2, rotate2},
        kSecondCall);
    first.invalid_count = second.invalid_count = views(invalid_count, "invalid_count");
    first.check_indices = second.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(state);
    hdk::dsv4::compress(first, second, current_stream(state));
  });
}

// store_entries' params for a store_and_compress call (the SWA ring is `swa_cache`).
hdk::dsv4::StoreEntriesParams swa_store_params(CallViews& views, const at::Tensor& values,
                                               const at::Tensor& slots, const at::Tensor& swa_cache,
                                               int64_t swa_block_size) {
  hdk::dsv4::StoreEntriesParams p;
  p.values = views(values, "values");
  p.slots = views(slots, "slots");
  p.cache = views(swa_cache, "swa_cache");
  p.block_size = swa_block_size;
  return p;
}

// A layer's SWA store with its compressor call in one launch (hdk::dsv4::store_and_compress):
// store_entries' tensors and block size, then the call's tensors and options in the order of
// dsv4_compress, one counter and one check option for both.
template <bool kMeta>
void store_and_compress(const at::Tensor& values, const at::Tensor& slots,
                        const at::Tensor& swa_cache, int64_t swa_block_size, const at::Tensor& kv,
                        const at::Tensor& score, const at::Tensor& ape, const at::Tensor& positions,
                        const at::Tensor& state_slots, const at::Tensor& state,
                        const at::Tensor& norm_weight, const at::Tensor& rope_cos,
                        const at::Tensor& rope_sin, const at::Tensor& block_table,
                        const at::Tensor& cache, int64_t block_size, int64_t ratio, double norm_eps,
                        int64_t key_format_value, bool rotate, const OptionalTensor& invalid_count,
                        bool check_indices) {
  CallViews views("hdk::dsv4::store_and_compress", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::StoreEntriesParams store =
        swa_store_params(views, values, slots, swa_cache, swa_block_size);
    hdk::dsv4::CompressorParams call = compressor_params(
        views,
        {kv, score, ape, positions, state_slots, state, norm_weight, rope_cos, rope_sin,
         block_table, cache, block_size, ratio, norm_eps, key_format_value, rotate},
        kFirstCall);
    store.invalid_count = call.invalid_count = views(invalid_count, "invalid_count");
    store.check_indices = call.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(state);
    hdk::dsv4::store_and_compress(store, call, current_stream(state));
  });
}

// The same with a CSA layer's two compressor calls: each call's tensors and options in the order
// of dsv4_compress.
template <bool kMeta>
void store_and_compress_pair(
    const at::Tensor& values, const at::Tensor& slots, const at::Tensor& swa_cache,
    int64_t swa_block_size, const at::Tensor& kv, const at::Tensor& score, const at::Tensor& ape,
    const at::Tensor& positions, const at::Tensor& state_slots, const at::Tensor& state,
    const at::Tensor& norm_weight, const at::Tensor& rope_cos, const at::Tensor& rope_sin,
    const at::Tensor& block_table, const at::Tensor& cache, int64_t block_size, int64_t ratio,
    double norm_eps, int64_t key_format_value, bool rotate, const at::Tensor& kv2,
    const at::Tensor& score2, const at::Tensor& ape2, const at::Tensor& positions2,
    const at::Tensor& state_slots2, const at::Tensor& state2, const at::Tensor& norm_weight2,
    const at::Tensor& rope_cos2, const at::Tensor& rope_sin2, const at::Tensor& block_table2,
    const at::Tensor& cache2, int64_t block_size2, int64_t ratio2, double norm_eps2,
    int64_t key_format_value2, bool rotate2, const OptionalTensor& invalid_count,
    bool check_indices) {
  CallViews views("hdk::dsv4::store_and_compress", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::StoreEntriesParams store =
        swa_store_params(views, values, slots, swa_cache, swa_block_size);
    hdk::dsv4::CompressorParams first = compressor_params(
        views,
        {kv, score, ape, positions, state_slots, state, norm_weight, rope_cos, rope_sin,
         block_table, cache, block_size, ratio, norm_eps, key_format_value, rotate},
        kFirstCall);
    hdk::dsv4::CompressorParams second = compressor_params(
        views,
        {kv2, score2, ape2, positions2, state_slots2, state2, norm_weight2, rope_cos2, rope_sin2,
         block_table2, cache2, block_size2, ratio2, norm_eps2, key_format_value2, rotate2},
        kSecondCall);
    store.invalid_count = first.invalid_count = second.invalid_count =
        views(invalid_count, "invalid_count");
    store.check_indices = first.check_indices = second.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(state);
    hdk::dsv4::store_and_compress(store, first, second, current_stream(state));
  });
}

}  // namespace
}  // namespace hdk_python

TORCH_LIBRARY_FRAGMENT(hdk, m) {
  m.def(
      "dsv4_store_entries(Tensor values, Tensor slots, Tensor(a!) cache, int block_size, "
      "Tensor(b!)? invalid_count, bool check_indices) -> ()");
  m.def(
      "dsv4_gather_entries(Tensor cache, int block_size, Tensor slots, Tensor(a!) out, "
      "Tensor(b!)? invalid_count, bool check_indices) -> ()");
  m.def(
      "dsv4_store_indexer_keys(Tensor keys, Tensor slots, Tensor(a!) cache, int block_size, "
      "int format, bool rotate, Tensor(b!)? invalid_count, bool check_indices) -> ()");
  m.def(
      "dsv4_gather_indexer_keys(Tensor cache, int block_size, Tensor slots, Tensor(a!) out, "
      "int format, Tensor(b!)? invalid_count, bool check_indices) -> ()");
  m.def(
      "dsv4_compress(Tensor kv, Tensor score, Tensor ape, Tensor positions, Tensor state_slots, "
      "Tensor(a!) state, Tensor norm_weight, Tensor rope_cos, Tensor rope_sin, Tensor block_table, "
      "Tensor(b!) cache, int block_size, int ratio, float norm_eps, int key_format, bool rotate, "
      "Tensor(c!)? invalid_count, bool check_indices) -> ()");
  m.def(
      "dsv4_compress_pair(Tensor kv, Tensor score, Tensor ape, Tensor positions, "
      "Tensor state_slots, Tensor(a!) state, Tensor norm_weight, Tensor rope_cos, "
      "Tensor rope_sin, Tensor block_table, Tensor(b!) cache, int block_size, int ratio, "
      "float norm_eps, int key_format, bool rotate, Tensor kv2, Tensor score2, Tensor ape2, "
      "Tensor positions2, Tensor state_slots2, Tensor(c!) state2, Tensor norm_weight2, "
      "Tensor rope_cos2, Tensor rope_sin2, Tensor block_table2, Tensor(d!) cache2, "
      "int block_size2, int ratio2, float norm_eps2, int key_format2, bool rotate2, "
      "Tensor(e!)? invalid_count, bool check_indices) -> ()");
  m.def(
      "dsv4_store_and_compress(Tensor values, Tensor slots, Tensor(a!) swa_cache, "
      "int swa_block_size, Tensor kv, Tensor score, Tensor ape, Tensor positions, "
      "Tensor state_slots, Tensor(b!) state, Tensor norm_weight, Tensor rope_cos, "
      "Tensor rope_sin, Tensor block_table, Tensor(c!) cache, int block_size, int ratio, "
      "float norm_eps, int key_format, bool rotate, Tensor(d!)? invalid_count, "
      "bool check_indices) -> ()");
  m.def(
      "dsv4_store_and_compress_pair(Tensor values, Tensor slots, Tensor(a!) swa_cache, "
      "int swa_block_size, Tensor kv, Tensor score, Tensor ape, Tensor positions, "
      "Tensor state_slots, Tensor(b!) state, Tensor norm_weight, Tensor rope_cos, "
      "Tensor rope_sin, Tensor block_table, Tensor(c!) cache, int block_size, int ratio, "
      "float norm_eps, int key_format, bool rotate, Tensor kv2, Tensor score2, Tensor ape2, "
      "Tensor positions2, Tensor state_slots2, Tensor(d!) state2, Tensor norm_weight2, "
      "Tensor rope_cos2, Tensor rope_sin2, Tensor block_table2, Tensor(e!) cache2, "
      "int block_size2, int ratio2, float norm_eps2, int key_format2, bool rotate2, "
      "Tensor(f!)? invalid_count, bool check_indices) -> ()");
  m.def(
      "dsv4_blocks_to_reserve(int ratio, int block_size, int position_before, int position_after) "
      "-> int",
      [](int64_t ratio, int64_t block_size, int64_t before, int64_t after) {
        int64_t result = 0;
        hdk_python::call_hdk(
            [&] { result = hdk::dsv4::blocks_to_reserve(ratio, block_size, before, after); });
        return result;
      });
}

#define HDK_KV_REGISTER(key, meta)                                                      \
  TORCH_LIBRARY_IMPL(hdk, key, m) {                                                     \
    m.impl("dsv4_store_entries", &hdk_python::store_entries<meta>);                     \
    m.impl("dsv4_gather_entries", &hdk_python::gather_entries<meta>);                   \
    m.impl("dsv4_store_indexer_keys", &hdk_python::store_indexer_keys<meta>);           \
    m.impl("dsv4_gather_indexer_keys", &hdk_python::gather_indexer_keys<meta>);         \
    m.impl("dsv4_compress", &hdk_python::compress<meta>);                               \
    m.impl("dsv4_compress_pair", &hdk_python::compress_pair<meta>);                     \
    m.impl("dsv4_store_and_compress", &hdk_python::store_and_compress<meta>);           \
    m.impl("dsv4_store_and_compress_pair", &hdk_python::store_and_compress_pair<meta>); \
  }

HDK_KV_REGISTER(CPU, false)
HDK_KV_REGISTER(CUDA, false)
HDK_KV_REGISTER(Meta, true)

#if TORCH_VERSION_MAJOR < 2
TORCH_LIBRARY_IMPL(hdk, AutogradMeta, m) {
  for (const char* name : {"dsv4_store_entries", "dsv4_gather_entries", "dsv4_store_indexer_keys",
                           "dsv4_gather_indexer_keys", "dsv4_compress", "dsv4_compress_pair",
                           "dsv4_store_and_compress", "dsv4_store_and_compress_pair"}) {
    m.impl(name, torch::CppFunction::makeFallthrough());
  }
}
#endif
