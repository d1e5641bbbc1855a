// The named (bar.sync) barriers of the sm90 forward kernel, their ids and who meets at each.
#pragma once

#include <cutlass/arch/barrier.h>

namespace cuteattn::sm90 {

// User ids; cutlass::arch::NamedBarrier adds the ids CUTLASS reserves for itself.
enum class FwdBarrier : uint32_t {
  kQueryEmpty0 = 0,    // consumers (arrive) -> producer warp (sync): Q slot 0 is free (its tile's Q K^T done)
  kQueryEmpty1 = 1,    // the same for Q slot 1
  kMmaSchedWG0 = 2,    // pingpong: warpgroup 0 may issue its wgmmas
  kMmaSchedWG1 = 3,    // pingpong: warpgroup 1 may issue its wgmmas
  kEpilogueWG0 = 4,    // consumer warpgroup 0 alone: its O staging buffer is free / written
  kEpilogueWG1 = 5,    // consumer warpgroup 1 alone: the same
};

CUTE_DEVICE void barrier_sync(uint32_t threads, FwdBarrier id) {
  cutlass::arch::NamedBarrier::sync(threads, static_cast<uint32_t>(id));
}
CUTE_DEVICE void barrier_arrive(uint32_t threads, FwdBarrier id) {
  cutlass::arch::NamedBarrier::arrive(threads, static_cast<uint32_t>(id));
}
CUTE_DEVICE FwdBarrier offset(FwdBarrier base, int by) {
  return static_cast<FwdBarrier>(static_cast<uint32_t>(base) + by);
}

// Pingpong between the two consumer warpgroups: while one issues its wgmmas the other runs softmax.
// Warpgroup w waits for its turn, issues, then hands the turn to the other warpgroup.
template <int kNumMmaThreads>
struct MmaScheduler {
  int wg;  // consumer warpgroup index, 0 or 1

  // Warpgroup 0 goes first: it grants itself the first turn.
  CUTE_DEVICE void init() const {
    if (wg == 0) barrier_arrive(kNumMmaThreads, FwdBarrier::kMmaSchedWG0);
  }
  CUTE_DEVICE void wait_turn() const { barrier_sync(kNumMmaThreads, offset(FwdBarrier::kMmaSchedWG0, wg)); }
  CUTE_DEVICE void pass_turn() const { barrier_arrive(kNumMmaThreads, offset(FwdBarrier::kMmaSchedWG0, 1 - wg)); }
};

}  // namespace cuteattn::sm90
