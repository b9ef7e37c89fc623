#pragma once

#define HDK_VERSION_MAJOR 0
#define HDK_VERSION_MINOR 1
#define HDK_VERSION_PATCH 0

namespace hdk {

// "0.1.0"; the library reports the version it was built as, which may differ from these macros
// when headers and library come from different installs.
const char* version();

// True when this build of the library contains the CUDA backend.
bool built_with_cuda();

}  // namespace hdk
