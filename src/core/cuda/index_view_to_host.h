// check_indices on CUDA tensors: an index view's bytes copied to the host, where the operation's
// host-side index check reads them (compiled only with HDK_WITH_CUDA).
#pragma once

#include <cstdint>
#include <vector>

#include "core/index_view.h"
#include "hdk/cuda_stream.h"

namespace hdk {
namespace detail {

// `index` ([rows, columns] with its strides, in the memory of CUDA device `device`) copied into
// `storage`, synchronizing `stream`; returns the view of the copy (the same strides). `operation`
// names the call in the error a failed copy throws.
IndexView copy_indices_to_host(const IndexView& index, int64_t rows, int64_t columns,
                               std::vector<uint8_t>& storage, int device, CudaStream stream,
                               const char* operation = "hdk (check_indices)");

}  // namespace detail
}  // namespace hdk
