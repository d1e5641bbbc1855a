// SM count and opt-in shared memory per block of a device, which the sm80 entry points consult on every call
// (shared-memory checks, deterministic split counts): queried once per device, thread-safe.
#pragma once

#include <mutex>

#include <cuda_runtime.h>

namespace cuteattn::detail {

struct Sm80DeviceInfo {
  int sms = 0;
  int smem_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes

  static Sm80DeviceInfo of(int device) {
    constexpr int kMaxDevices = 64;
    static std::once_flag once[kMaxDevices];
    static Sm80DeviceInfo info[kMaxDevices];
    auto query = [device] {
      Sm80DeviceInfo d;
      if (cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) d.sms = 132;
      if (cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        d.smem_optin = 0;
      }
      return d;
    };
    if (device < 0 || device >= kMaxDevices) return query();
    std::call_once(once[device], [&] { info[device] = query(); });
    return info[device];
  }
};

}  // namespace cuteattn::detail
