// Version and build information.
#include "cuteattn/version.h"

#if CUTEATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cuteattn {

const char* version() { return CUTEATTN_VERSION; }

const char* compiled_archs() { return CUTEATTN_ARCHS_STRING; }

bool cuda_available() {
#if CUTEATTN_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

}  // namespace cuteattn
