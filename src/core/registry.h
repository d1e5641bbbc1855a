// The table of compiled GPU kernels. Its entries are generated (tools/generate_instances.py, the only list
// of instantiations); dispatch looks kernels up here and never names an instantiation by hand.
#pragma once

#include <cstddef>

#include "core/params.h"
#include "cuteattn/types.h"

namespace cuteattn::detail {

enum class KernelFamily : int { kSm80Forward = 0, kSm80Backward = 1, kSm90Forward = 2, kSm90Backward = 3 };

struct KernelKey {
  KernelFamily family;
  ScoreFunction score;
  DType dtype;
  int head_dim;  // compiled bucket; the kernel serves every d, d_v <= head_dim it accepts in `supports`
};

struct KernelEntry {
  // Whether this instance can run the problem (head dims, d != d_v, features); an explanation otherwise.
  Status (*supports)(const Params& params) = nullptr;
  // Bytes of device scratch `launch` needs (0 for most forward kernels).
  size_t (*workspace_bytes)(const Params& params) = nullptr;
  // Enqueue the kernel(s) on params.stream. `workspace` has workspace_bytes(params) bytes.
  Status (*launch)(const Params& params, void* workspace) = nullptr;
  // Whether `auto` dispatch may pick this instance; false where another family runs its calls faster (an
  // explicit backend still gets it).
  bool auto_dispatch = true;
};

// Null when the instance was not compiled into this build.
const KernelEntry* find_kernel(const KernelKey& key);

// The head-dim buckets compiled for a family (for error messages and dispatch), ascending.
int compiled_head_dims(KernelFamily family, ScoreFunction score, DType dtype, int* out, int max_out);

}  // namespace cuteattn::detail
