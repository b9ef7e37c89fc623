// Entry points of the KV cache operations: validate once, then hand the problem to the backend of
// the device the tensors live on. The CPU checks index ranges on the host first (an hdk::Error
// before anything is written); the CUDA kernels skip and count such rows instead.
#include "hdk/dsv4/kv_cache.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/argument_checks.h"
#include "dsv4/kv_cache/cpu/kv_cache_cpu.h"
#include "dsv4/kv_cache/kv_cache_validation.h"
#include "hdk/error.h"

#ifdef HDK_WITH_CUDA
#include "dsv4/kv_cache/cuda/kv_cache_cuda.h"
#endif

namespace hdk {
namespace dsv4 {
namespace {

#ifdef HDK_WITH_CUDA
#define HDK_KV_CUDA_ONLY(statement) statement
#else
#define HDK_KV_CUDA_ONLY(statement) (void)0
#endif

// Runs `cpu` or `cuda` on the device of `device`.
template <typename Cpu, typename Cuda>
void dispatch(const char* operation, const Device& device, Cpu&& cpu, Cuda&& cuda) {
  if (device.is_cpu()) {
    cpu();
    return;
  }
#ifdef HDK_WITH_CUDA
  cuda();
#else
  (void)cuda;
  hdk::detail::throw_no_cuda_backend(operation, device);
#endif
}

// The store and gather calls: the CPU checks `slots` ([rows, columns]) against `pool` before
// running `cpu`; CUDA checks a host copy only with `check_indices`, then runs `cuda`.
template <typename Cpu, typename Cuda>
void run_with_slots(const char* operation, const Device& device, bool check_indices,
                    CudaStream stream, const detail::IndexView& slots, int64_t rows,
                    int64_t columns, const detail::PagedPool& pool, detail::SlotUse use, Cpu&& cpu,
                    Cuda&& cuda) {
  dispatch(
      operation, device,
      [&] {
        detail::check_slots(operation, slots, rows, columns, pool, use);
        cpu();
      },
      [&] {
#ifdef HDK_WITH_CUDA
        if (check_indices) {
          std::vector<uint8_t> storage;
          detail::check_slots(
              operation,
              detail::copy_indices_to_host(slots, rows, columns, storage, device.index, stream),
              rows, columns, pool, use);
        }
#else
        (void)check_indices, (void)stream;
#endif
        cuda();
      });
}

}  // namespace

void store_entries(const StoreEntriesParams& params) {
  store_entries(params, nullptr);
}

void store_entries(const StoreEntriesParams& params, CudaStream stream) {
  const detail::StoreEntriesProblem problem = detail::validate_store_entries(params);
  run_with_slots(
      "hdk::dsv4::store_entries", params.cache.device, params.check_indices, stream, problem.slots,
      problem.num_rows, 1, problem.cache, detail::SlotUse::kWrite,
      [&] { detail::store_entries_cpu(problem); },
      [&] {
        HDK_KV_CUDA_ONLY(detail::store_entries_cuda(problem, params.cache.device.index, stream));
      });
}

void gather_entries(const GatherEntriesParams& params) {
  gather_entries(params, nullptr);
}

void gather_entries(const GatherEntriesParams& params, CudaStream stream) {
  const detail::GatherEntriesProblem problem = detail::validate_gather_entries(params);
  run_with_slots(
      "hdk::dsv4::gather_entries", params.out.device, params.check_indices, stream, problem.slots,
      problem.num_rows, problem.num_columns, problem.cache, detail::SlotUse::kRead,
      [&] { detail::gather_entries_cpu(problem); },
      [&] {
        HDK_KV_CUDA_ONLY(detail::gather_entries_cuda(problem, params.out.device.index, stream));
      });
}

void store_indexer_keys(const StoreIndexerKeysParams& params) {
  store_indexer_keys(params, nullptr);
}

void store_indexer_keys(const StoreIndexerKeysParams& params, CudaStream stream) {
  const detail::StoreKeysProblem problem = detail::validate_store_indexer_keys(params);
  run_with_slots(
      "hdk::dsv4::store_indexer_keys", params.cache.device, params.check_indices, stream,
      problem.slots, problem.num_rows, 1, problem.cache, detail::SlotUse::kWrite,
      [&] { detail::store_indexer_keys_cpu(problem); },
      [&] {
        HDK_KV_CUDA_ONLY(
            detail::store_indexer_keys_cuda(problem, params.cache.device.index, stream));
      });
}

void gather_indexer_keys(const GatherIndexerKeysParams& params) {
  gather_indexer_keys(params, nullptr);
}

void gather_indexer_keys(const GatherIndexerKeysParams& params, CudaStream stream) {
  const detail::GatherKeysProblem problem = detail::validate_gather_indexer_keys(params);
  run_with_slots(
      "hdk::dsv4::gather_indexer_keys", params.out.device, params.check_indices, stream,
      problem.slots, problem.num_rows, problem.num_columns, problem.cache, detail::SlotUse::kRead,
      [&] { detail::gather_indexer_keys_cpu(problem); },
      [&] {
        HDK_KV_CUDA_ONLY(
            detail::gather_indexer_keys_cuda(problem, params.out.device.index, stream));
      });
}

namespace {

// One launch of writes (validated): `count` compressor calls and, for store_and_compress, a
// store. On the CPU every call's indices are checked before any call writes, then the calls run
// in order (the store first); on CUDA one launch runs them all.
void run_writes(const detail::CompressorProblem* problems, const CompressorParams* const* params,
                int count, const detail::StoreEntriesProblem* store, bool check_store_indices,
                CudaStream stream) {
  const bool with_store = store != nullptr;
  const Device device = params[0]->state.device;
  dispatch(
      with_store ? "hdk::dsv4::store_and_compress" : "hdk::dsv4::compress", device,
      [&] {
        if (with_store) {
          detail::check_slots(detail::kStoreAndCompressStore, store->slots, store->num_rows, 1,
                              store->cache, detail::SlotUse::kWrite);
        }
        for (int i = 0; i < count; ++i) {
          detail::check_compressor_indices(problems[i],
                                           detail::compress_operation(count, i, with_store));
        }
        if (with_store) detail::store_entries_cpu(*store);
        for (int i = 0; i < count; ++i)
          detail::compress_cpu(problems[i]);
      },
      [&] {
#ifdef HDK_WITH_CUDA
        if (with_store && check_store_indices) {
          std::vector<uint8_t> slots;
          detail::check_slots(detail::kStoreAndCompressStore,
                              detail::copy_indices_to_host(store->slots, store->num_rows, 1, slots,
                                                           device.index, stream),
                              store->num_rows, 1, store->cache, detail::SlotUse::kWrite);
        }
        for (int i = 0; i < count; ++i) {
          if (!params[i]->check_indices) continue;
          std::vector<uint8_t> positions, state_slots, table;
          detail::CompressorProblem host = problems[i];
          const int64_t N = host.num_rows;
          host.positions = detail::copy_indices_to_host(problems[i].positions, N, 1, positions,
                                                        device.index, stream);
          host.state_slots = detail::copy_indices_to_host(problems[i].state_slots, N, 1,
                                                          state_slots, device.index, stream);
          host.block_table = detail::copy_indices_to_host(
              problems[i].block_table, N, problems[i].max_blocks, table, device.index, stream);
          detail::check_compressor_indices(host, detail::compress_operation(count, i, with_store));
        }
        detail::write_layer_cuda(problems, count, store, device.index, stream);
#else
        (void)check_store_indices, (void)stream;
#endif
      });
}

}  // namespace

void compress(const CompressorParams& params) {
  compress(params, nullptr);
}

void compress(const CompressorParams& params, CudaStream stream) {
  const detail::CompressorProblem problem = detail::validate_compress(params);
  const CompressorParams* calls[1] = {&params};
  run_writes(&problem, calls, 1, nullptr, false, stream);
}

void compress(const CompressorParams& first, const CompressorParams& second) {
  compress(first, second, nullptr);
}

void compress(const CompressorParams& first, const CompressorParams& second, CudaStream stream) {
  const std::array<detail::CompressorProblem, 2> problems =
      detail::validate_compress_pair(first, second);
  const CompressorParams* calls[2] = {&first, &second};
  run_writes(problems.data(), calls, 2, nullptr, false, stream);
}

void store_and_compress(const StoreEntriesParams& store, const CompressorParams& compressor) {
  store_and_compress(store, compressor, nullptr);
}

void store_and_compress(const StoreEntriesParams& store, const CompressorParams& compressor,
                        CudaStream stream) {
  const CompressorParams* calls[1] = {&compressor};
  const detail::LayerWritesProblem problem = detail::validate_store_and_compress(store, calls, 1);
  run_writes(problem.compressors, calls, 1, &problem.store, store.check_indices, stream);
}

void store_and_compress(const StoreEntriesParams& store, const CompressorParams& first,
                        const CompressorParams& second) {
  store_and_compress(store, first, second, nullptr);
}

void store_and_compress(const StoreEntriesParams& store, const CompressorParams& first,
                        const CompressorParams& second, CudaStream stream) {
  const CompressorParams* calls[2] = {&first, &second};
  const detail::LayerWritesProblem problem = detail::validate_store_and_compress(store, calls, 2);
  run_writes(problem.compressors, calls, 2, &problem.store, store.check_indices, stream);
}

}  // namespace dsv4
}  // namespace hdk
