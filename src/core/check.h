// Internal entry to the argument checker for callers that need only the shapes, not the device data.
#pragma once

#include "cuteattn/attention.h"

namespace cuteattn::detail {

// check_forward / check_backward, with the reads of cu_seqlens / context / target contents (a device-to-host copy and a stream
// sync on CUDA) only when read_device_data is set.
Status check_forward_arguments(const ForwardArgs& args, bool read_device_data);
Status check_backward_arguments(const BackwardArgs& args, bool read_device_data);

}  // namespace cuteattn::detail
