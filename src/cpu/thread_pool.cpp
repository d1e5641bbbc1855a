// Fork-join parallel loop (see thread_pool.h): std::thread workers pull item indices from an atomic counter.
#include "cpu/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

namespace cuteattn::detail::cpu {

int resolve_threads(int requested, int64_t items) {
  int64_t n = requested > 0 ? requested : static_cast<int64_t>(std::thread::hardware_concurrency());
  if (n < 1) n = 1;
  if (n > items) n = items;
  return n < 1 ? 1 : static_cast<int>(n);
}

void parallel_for(int64_t items, int threads, const std::function<void(int64_t, int)>& fn) {
  if (items <= 0) return;
  if (threads <= 1) {
    for (int64_t i = 0; i < items; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&](int worker) {
    for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) fn(i, worker);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
}

}  // namespace cuteattn::detail::cpu
