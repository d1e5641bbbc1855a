// GPU side of dispatch: choosing a kernel family and head-dim bucket, workspace, launch.
#pragma once

#include "core/params.h"
#include "cuteattn/types.h"

namespace cuteattn::detail {

// The GPU backend kAuto becomes for this problem on params.device_index (kSm90 or kSm80).
Status resolve_gpu_backend(const Params& params, bool backward, Backend* chosen);

Status gpu_forward(const Params& params, Backend backend);
Status gpu_backward(const Params& params, Backend backend, void* workspace, size_t workspace_bytes);
size_t gpu_backward_workspace_bytes(const Params& params, Backend backend);

}  // namespace cuteattn::detail
