// GPU dispatch: picks the kernel family for the device, the smallest compiled head-dim bucket that holds
// d and d_v, provides workspace, and launches. Built without CUDA, every GPU request is refused cleanly.
#include "core/gpu_dispatch.h"

#include <string>

#include "core/registry.h"

#if CUTEATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>

#include "core/device_properties.h"
#endif

namespace cuteattn::detail {

#if CUTEATTN_WITH_CUDA
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

// Makes params.device_index current for the scope of one call and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) {
      status_ = cuda_status(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  const Status& status() const { return status_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  Status status_;
};

KernelFamily family_of(Backend backend, bool backward) {
  if (backend == Backend::kSm90) return backward ? KernelFamily::kSm90Backward : KernelFamily::kSm90Forward;
  return backward ? KernelFamily::kSm80Backward : KernelFamily::kSm80Forward;
}

// The entry of the smallest compiled bucket >= max(d, d_v) that supports the problem.
Status find_entry(const Params& p, Backend backend, bool backward, const KernelEntry** out) {
  const KernelFamily family = family_of(backend, backward);
  const int need = static_cast<int>(p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v);
  int dims[16];
  const int n = compiled_head_dims(family, p.score, p.dtype, dims, 16);
  for (int i = 0; i < n; ++i) {
    if (dims[i] < need) continue;
    const KernelEntry* entry = find_kernel({family, p.score, p.dtype, dims[i]});
    Status s = entry->supports(p);
    if (!s.ok()) return s;
    *out = entry;
    return Status::Ok();
  }
  std::string compiled;
  for (int i = 0; i < n; ++i) compiled += (i ? ", " : "") + std::to_string(dims[i]);
  return Status::NotSupported(std::string(backend_name(backend)) + (backward ? " backward" : " forward") +
                              ": no " + (p.score == ScoreFunction::kSoftmax ? "softmax" : "hstu") + " " +
                              dtype_name(p.dtype) + " kernel for head dim " + std::to_string(need) +
                              " in this build (compiled head dims: " + (n ? compiled : "none") + ")");
}

// Forward scratch for calls without a workspace: one zeroed buffer per (device, stream), allocated on first use
// and kept for the life of the process. Calls on one stream run in order, so the calls of a stream share it:
// what the forward kernels read there they either leave as they found it (the sm90 tile counter returns to
// zero) or write first in the same call (split-KV partials).
// *out stays null when the buffer would have to be allocated while the stream is being captured (cudaMalloc
// is not allowed then): the caller allocates for the call instead.
Status stream_scratch(int device, cudaStream_t stream, size_t bytes, void** out) {
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, Buffer> buffers;
  std::lock_guard<std::mutex> lock(mutex);
  Buffer& b = buffers[{device, stream}];
  *out = nullptr;
  if (b.bytes < bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    Status s = cuda_status(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (!s.ok() || capture != cudaStreamCaptureStatusNone) return s;
    void* fresh = nullptr;
    s = cuda_status(cudaMalloc(&fresh, bytes), "cudaMalloc(forward scratch)");
    if (s.ok()) s = cuda_status(cudaMemset(fresh, 0, bytes), "cudaMemset(forward scratch)");
    if (!s.ok()) {
      cudaFree(fresh);
      return s;
    }
    // The old buffer may still be in use by work queued on the stream.
    if (b.ptr != nullptr) cudaFreeAsync(b.ptr, stream);
    b = {fresh, bytes};
  }
  *out = b.ptr;
  return Status::Ok();
}

Status run(const Params& p, Backend backend, bool backward, void* workspace, size_t workspace_bytes) {
  DeviceGuard guard(p.device_index);
  if (!guard.status().ok()) return guard.status();
  const int cc = DeviceProperties::of(p.device_index).compute_capability;
  if (backend == Backend::kSm90 && cc != 90)
    return Status::NotSupported("backend: sm90 kernels need an sm_90 (Hopper) GPU; this one is sm_" +
                                std::to_string(cc));
  if (cc < 80)
    return Status::NotSupported("backend: cuteattn GPU kernels need sm_80 or newer; this GPU is sm_" +
                                std::to_string(cc));
  const KernelEntry* entry = nullptr;
  Status s = find_entry(p, backend, backward, &entry);
  if (!s.ok()) return s;

  auto stream = static_cast<cudaStream_t>(p.stream);
  const size_t need = entry->workspace_bytes(p);
  void* owned = nullptr;
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) {
    if (workspace != nullptr)
      return Status::Invalid("workspace", std::to_string(workspace_bytes) + " bytes given, " +
                                              std::to_string(need) + " needed");
    if (!backward) {
      s = stream_scratch(p.device_index, stream, need, &workspace);
      if (!s.ok()) return s;
    }
    if (workspace == nullptr) {
      s = cuda_status(cudaMallocAsync(&owned, need, stream), "cudaMallocAsync(workspace)");
      if (!s.ok()) return s;
      workspace = owned;
    }
  }
  s = entry->launch(p, workspace);
  if (owned) {
    Status f = cuda_status(cudaFreeAsync(owned, stream), "cudaFreeAsync(workspace)");
    if (s.ok()) s = f;
  }
  return s;
}

}  // namespace

Status resolve_gpu_backend(const Params& p, bool backward, Backend* chosen) {
  DeviceGuard guard(p.device_index);
  if (!guard.status().ok()) return guard.status();
  const KernelEntry* entry = nullptr;
  const bool hopper = DeviceProperties::of(p.device_index).compute_capability == 90;
  if (hopper && find_entry(p, Backend::kSm90, backward, &entry).ok() && entry->auto_dispatch) {
    *chosen = Backend::kSm90;
    return Status::Ok();
  }
  *chosen = Backend::kSm80;
  return Status::Ok();
}

Status gpu_forward(const Params& p, Backend backend, void* workspace, size_t workspace_bytes) {
  return run(p, backend, false, workspace, workspace_bytes);
}

Status gpu_backward(const Params& p, Backend backend, void* workspace, size_t workspace_bytes) {
  return run(p, backend, true, workspace, workspace_bytes);
}

size_t gpu_workspace_bytes(const Params& p, Backend backend, bool backward) {
  const KernelEntry* entry = nullptr;
  if (!find_entry(p, backend, backward, &entry).ok()) return 0;
  return entry->workspace_bytes(p);
}

#else  // built without CUDA

namespace {
Status no_cuda() {
  return Status::NotSupported("backend: this cuteattn build has no CUDA support (rebuild with CUTEATTN_CUDA=ON)");
}
}  // namespace

Status resolve_gpu_backend(const Params&, bool, Backend*) { return no_cuda(); }
Status gpu_forward(const Params&, Backend, void*, size_t) { return no_cuda(); }
Status gpu_backward(const Params&, Backend, void*, size_t) { return no_cuda(); }
size_t gpu_workspace_bytes(const Params&, Backend, bool) { return 0; }

#endif

}  // namespace cuteattn::detail
