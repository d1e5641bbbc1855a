// The two CPU backends: a float64 oracle written straight from SEMANTICS.md (reference.cpp) and the tiled
// FlashAttention-2 algorithm (tiled_forward.cpp, tiled_backward.cpp). Both take checked, normalised Params.
#pragma once

#include "core/params.h"

namespace cuteattn::detail::cpu {

// Float64 oracle: plain loops, its own visibility rule; outputs written in the tensors' dtype.
Status reference_forward(const Params& p);
Status reference_backward(const Params& p);
// The oracle's own visibility rule: may query row i of sequence bi (lengths sq, sk) see key j? Reads only the
// mask fields of p (window_left/right, num_contexts, num_targets, target_group_size). Tests check the shared
// Mask policy against it.
bool reference_visible(const Params& p, int64_t bi, int64_t sq, int64_t sk, int64_t i, int64_t j);

// FlashAttention-2 on the CPU: fp32 tiles, online softmax, block skipping from the shared Mask policy,
// multithreaded. The backward is deterministic for any thread count.
Status tiled_forward(const Params& p);
Status tiled_backward(const Params& p);

}  // namespace cuteattn::detail::cpu
