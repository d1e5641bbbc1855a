// What the GPU entry points ask of a device on every call (compute capability, SM count, opt-in shared memory,
// L2 size), queried once per device and cached thread-safely, and the once-per-(kernel, device) shared-memory
// opt-in of a launch. Devices past the cache are queried on every call.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

namespace cuteattn::detail {

constexpr int kMaxCachedDevices = 64;

struct DeviceProperties {
  int compute_capability = 0;  // major * 10 + minor
  int sms = 0;
  int smem_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
  int l2_bytes = 0;

  static DeviceProperties query(int device) {
    DeviceProperties d;
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    d.compute_capability = major * 10 + minor;
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device);
    return d;
  }

  static DeviceProperties of(int device) {
    static std::once_flag once[kMaxCachedDevices];
    static DeviceProperties cached[kMaxCachedDevices];
    if (device < 0 || device >= kMaxCachedDevices) return query(device);
    std::call_once(once[device], [device] { cached[device] = query(device); });
    return cached[device];
  }
};

// cudaFuncSetAttribute(kernel, max dynamic smem, bytes) on the current device, once per (Tag, device); the
// result of that one call is returned to every later caller.
template <class Tag, class Kernel>
cudaError_t opt_in_shared_memory(Kernel kernel, int bytes, int device) {
  static std::once_flag once[kMaxCachedDevices];
  static cudaError_t result[kMaxCachedDevices];
  auto set = [&] { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); };
  if (device < 0 || device >= kMaxCachedDevices) return set();
  std::call_once(once[device], [&] { result[device] = set(); });
  return result[device];
}

}  // namespace cuteattn::detail
