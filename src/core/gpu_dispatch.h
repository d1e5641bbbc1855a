// GPU side of dispatch: choosing a kernel family and head-dim bucket, workspace, launch.
#pragma once

#include "core/params.h"
#include "cuteattn/types.h"

namespace cuteattn::detail {

// The GPU backend kAuto becomes for this problem on params.device_index (kSm90 or kSm80).
Status resolve_gpu_backend(const Params& params, bool backward, Backend* chosen);

// A null workspace: the forward uses a buffer kept per (device, stream), the backward allocates one for the call.
Status gpu_forward(const Params& params, Backend backend, void* workspace, size_t workspace_bytes);
Status gpu_backward(const Params& params, Backend backend, void* workspace, size_t workspace_bytes);
size_t gpu_workspace_bytes(const Params& params, Backend backend, bool backward);

}  // namespace cuteattn::detail
