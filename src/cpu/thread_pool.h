// Fork-join parallel loop over independent work items for the CPU tiled backend.
#pragma once

#include <cstdint>
#include <functional>

namespace cuteattn::detail::cpu {

// Number of workers for a request (0 = hardware threads), never more than `items`, at least 1.
int resolve_threads(int requested, int64_t items);

// Runs fn(item, worker) for every item in [0, items) on `threads` workers (the caller is worker 0).
// Items are handed out dynamically; `worker` in [0, threads) indexes per-worker scratch.
void parallel_for(int64_t items, int threads, const std::function<void(int64_t item, int worker)>& fn);

}  // namespace cuteattn::detail::cpu
