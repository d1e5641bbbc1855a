// The named (bar.sync) barriers of the sm90 forward kernel, their ids and who meets at each.
#pragma once

#include <cutlass/arch/barrier.h>

namespace cuteattn::sm90 {

// User ids; cutlass::arch::NamedBarrier adds the ids CUTLASS reserves for itself (8 of the 16 remain).
enum class FwdBarrier : uint32_t {
  kQueryEmpty0 = 0,    // consumers (arrive) -> producer warp (sync): Q slot 0 is free (its tile's Q K^T done)
  kQueryEmpty1 = 1,    // the same for Q slot 1
  kMmaSchedWG0 = 2,    // pingpong: consumer warpgroup 0 may issue its wgmmas
  kMmaSchedWG1 = 3,    // pingpong: warpgroup 1 may issue its wgmmas
  kMmaSchedWG2 = 4,    // pingpong: warpgroup 2 (three consumer warpgroups only)
  kEpilogueWG0 = 5,    // consumer warpgroup 0 alone: its O staging buffer is free / written
  kEpilogueWG1 = 6,    // consumer warpgroup 1 alone: the same
  kEpilogueWG2 = 7,    // consumer warpgroup 2 alone: the same
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

// Pingpong among the consumer warpgroups: while one issues its wgmmas the others run softmax. The turn goes
// round in warpgroup order: warpgroup w waits for its turn, issues, then hands the turn to w + 1 (the last to
// 0). Each barrier meets two warpgroups: the one that hands the turn over (arrive) and the one that waits.
template <int kNumMmaWarpGroups>
struct MmaScheduler {
  static constexpr uint32_t kThreads = 2 * 128;
  int wg;  // consumer warpgroup index, 0 to kNumMmaWarpGroups - 1

  // Warpgroup 0 goes first: it grants itself the first turn.
  CUTE_DEVICE void init() const {
    if (wg == 0) barrier_arrive(kThreads, FwdBarrier::kMmaSchedWG0);
  }
  CUTE_DEVICE void wait_turn() const { barrier_sync(kThreads, offset(FwdBarrier::kMmaSchedWG0, wg)); }
  CUTE_DEVICE void pass_turn() const {
    const int next = kNumMmaWarpGroups == 2 ? 1 - wg : wg == kNumMmaWarpGroups - 1 ? 0 : wg + 1;
    barrier_arrive(kThreads, offset(FwdBarrier::kMmaSchedWG0, next));
  }
};

}  // namespace cuteattn::sm90
