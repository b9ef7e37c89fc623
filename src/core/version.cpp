#include "hdk/version.h"

#define HDK_STRINGIFY_INNER(x) #x
#define HDK_STRINGIFY(x) HDK_STRINGIFY_INNER(x)

namespace hdk {

const char* version() {
  return HDK_STRINGIFY(HDK_VERSION_MAJOR) "." HDK_STRINGIFY(HDK_VERSION_MINOR) "." HDK_STRINGIFY(
      HDK_VERSION_PATCH);
}

bool built_with_cuda() {
#ifdef HDK_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace hdk
