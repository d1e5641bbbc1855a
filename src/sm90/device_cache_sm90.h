// Host side of the sm90 launches: what a launch asks of the device, answered once per device and cached
// (thread-safe), so that a forward call makes no CUDA attribute query of its own.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

namespace cuteattn::sm90 {

constexpr int kMaxCachedDevices = 64;

struct DeviceProperties {
  int num_sms = 0;
  int l2_bytes = 0;
};

inline DeviceProperties query_device_properties(int device) {
  DeviceProperties d;
  cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device);
  return d;
}

// Devices past kMaxCachedDevices are queried on every call.
inline DeviceProperties device_properties(int device) {
  static std::once_flag once[kMaxCachedDevices];
  static DeviceProperties cached[kMaxCachedDevices];
  if (device < 0 || device >= kMaxCachedDevices) return query_device_properties(device);
  std::call_once(once[device], [device] { cached[device] = query_device_properties(device); });
  return cached[device];
}

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

}  // namespace cuteattn::sm90
