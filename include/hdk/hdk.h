// The whole public API of hdk.
#pragma once

#include "hdk/cuda_stream.h"
#include "hdk/device.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/block_allocator.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dsv4/router.h"
#include "hdk/dtype.h"
#include "hdk/error.h"
#include "hdk/gdn/decode.h"
#include "hdk/tensor_view.h"
#include "hdk/topk.h"
#include "hdk/version.h"
