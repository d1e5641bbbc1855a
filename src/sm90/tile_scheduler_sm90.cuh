// Persistent tile scheduler of the sm90 forward kernel over (m block, head, batch) tiles (packed GQA: (packed
// m block, kv head, batch), see unpack_row), and what one tile does (TileWork). Without a mask
// every tile costs the same: a static round-robin, producer and consumers walk the same sequence without
// talking. With causal/window masks or jagged lengths tile costs differ (0 to n blocks) and a static
// assignment leaves SMs idle (measured: 25% over the average on the busiest SM at s = 16k), so CTAs claim
// tiles from a global counter: the producer warp claims the next tile while its consumers still work and
// hands it over through smem.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "core/host_device.h"
#include "core/params.h"
#include "variants/mask.h"
#include "variants/sequence.h"

namespace cuteattn::sm90 {

struct TileCoord {
  int m_block;
  int head;
  int batch;
};

// Division of non-negative 32-bit values below 2^31 by a divisor fixed at launch, as a multiply-high and a
// shift (round-up reciprocal): the per-tile decode ran a full 32-bit division (float reciprocal and fix-ups,
// ~20 instructions each) four or five times in every consumer thread.
struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;  // 0: the divisor is 1
  uint32_t shift = 0;

  FastDivisor() = default;
  explicit FastDivisor(int d) : divisor(uint32_t(d)) {
    if (d <= 1) return;
    uint32_t log2_ceil = 0;
    while ((uint32_t(1) << log2_ceil) < divisor) ++log2_ceil;
    const uint64_t p = 31 + log2_ceil;
    multiplier = uint32_t(((uint64_t(1) << p) + divisor - 1) / divisor);
    shift = uint32_t(p - 32);
  }
  CUTEATTN_HD int div(int n) const {
    if (multiplier == 0) return n;
#if defined(__CUDA_ARCH__)
    return int(__umulhi(uint32_t(n), multiplier) >> shift);
#else
    return int(uint32_t((uint64_t(uint32_t(n)) * multiplier) >> 32) >> shift);
#endif
  }
  CUTEATTN_HD int mod(int n, int q) const { return n - q * int(divisor); }
};

struct TileScheduler {
  int num_m_blocks = 0;
  int heads = 0;
  int num_bh = 0;  // heads * batch
  int num_tiles = 0;
  // With a mask whose work grows with m (causal, window) tiles are handed out longest first, in sections of
  // `section` (batch, head) pairs (the last section may be narrower). Without, consecutive tiles share one
  // (batch, head) so the CTAs running at once read the same K/V.
  bool longest_first = false;
  int section = 1;
  // Divisors of decode, set by init from the fields above.
  FastDivisor by_m_blocks, by_heads, by_section_tiles, by_section, by_last_width;

  void init() {
    by_m_blocks = FastDivisor(num_m_blocks);
    by_heads = FastDivisor(heads);
    by_section_tiles = FastDivisor(section * num_m_blocks);
    by_section = FastDivisor(section);
    const int last_width = num_bh - (num_bh - 1) / section * section;
    by_last_width = FastDivisor(last_width);
  }

  CUTEATTN_HD TileCoord decode(int tile) const {
    int m_block, bh;
    if (longest_first) {
      const int sec = by_section_tiles.div(tile);
      const int first_bh = sec * section;
      const FastDivisor& width = num_bh - first_bh < section ? by_last_width : by_section;
      const int idx = tile - sec * section * num_m_blocks;
      const int row = width.div(idx);
      m_block = num_m_blocks - 1 - row;
      bh = first_bh + width.mod(idx, row);
    } else {
      bh = by_m_blocks.div(tile);
      m_block = by_m_blocks.mod(tile, bh);
    }
    const int batch = by_heads.div(bh);
    return {m_block, by_heads.mod(bh, batch), batch};
  }
};

// Packed GQA (ForwardTraitsSm90::kPackGqa): a tile's (head) is a kv head and row i of m block b is packed row
// m = b * kBlockM + i of the g = h / h_k query heads of that kv head, the head fastest: query row m / g of query
// head kv_head * g + m % g. A tile then holds kBlockM / g query rows of all g heads, so the rows' key ranges
// (masks go by the query row) stay as narrow as in an unpacked tile of kBlockM / g rows. Packed rows are 32-bit
// (Sm90Forward::pack_gqa).
struct PackedRow {
  int row;            // query row within the sequence
  int head_in_group;  // 0 to g - 1
};
CUTEATTN_HD PackedRow unpack_row(int m, int g) {
  const int row = int(uint32_t(m) / uint32_t(g));
  return {row, m - row * g};
}

// Shared memory of the dynamic handoff: one slot and its two mbarriers.
struct TileHandoffStorage {
  cutlass::arch::ClusterBarrier full;   // 1 arrival (a producer lane): the slot holds the next tile
  cutlass::arch::ClusterBarrier empty;  // one arrival per consumer thread: every consumer has read the slot
  int next_tile;
};

// The producer warp claims tiles from the global counter and passes each to its consumers through one smem slot.
// Both directions synchronise on mbarriers (release on arrive, acquire on wait), which compute-sanitizer's
// racecheck models; bar.sync/bar.arrive pairs it does not. Each side tracks the phase it waits for; the producer
// starts one phase ahead, so its first wait on `empty` passes at once.
// The counter (a kernel parameter) and the storage (a fixed smem address) are passed to every call; the
// object holds only the consumers' phase. The producer passes its own (the parity of the tiles it published):
// its warp keeps the phase with its other counters in one register.
template <int kNumMmaThreads>
struct TileHandoff {
  uint32_t phase = 0;

  // One thread, before the block-wide barrier that publishes the mbarrier initialisation.
  CUTE_DEVICE static void init(TileHandoffStorage& s) {
    s.full.init(1);
    s.empty.init(kNumMmaThreads);
  }
  // Whole producer warp, before or after loading `tile` (forward_kernel_sm90 says when): claims the tile after it
  // (counter: global, zero at the launch; null = static round-robin); one lane holds the result until
  // producer_publish.
  CUTE_DEVICE static int producer_claim(int* counter, int tile) {
    if (counter == nullptr) return tile + int(gridDim.x);
    return cute::elect_one_sync() ? atomicAdd(counter, 1) + int(gridDim.x) : 0;
  }
  // Whole producer warp, after loading its tile: hands the claimed tile to the consumers and returns it.
  // A launch draws exactly num_tiles tickets (a CTA claims once per tile it runs): the lane that drew the last
  // one sets the counter back to zero, so back-to-back launches on one stream may share a counter.
  CUTE_DEVICE static int producer_publish(int* counter, TileHandoffStorage& s, int num_tiles, int claimed,
                                          uint32_t published_parity) {
    if (counter == nullptr) return claimed;
    if (claimed == num_tiles - 1 + int(gridDim.x)) atomicExch(counter, 0);
    const int next = __reduce_max_sync(0xffffffffu, claimed);
    if (threadIdx.x % 32 == 0) {
      s.empty.wait(published_parity ^ 1);
      s.next_tile = next;
      s.full.arrive();
    }
    __syncwarp();
    return next;
  }
  // Every consumer thread, after finishing `tile`: the next tile of this CTA.
  CUTE_DEVICE int consumer_next(int* counter, TileHandoffStorage& s, int tile) {
    if (counter == nullptr) return tile + int(gridDim.x);
    s.full.wait(phase);
    const int next = s.next_tile;
    s.empty.arrive();
    phase ^= 1;
    return next;
  }
};

// What one tile of query rows does: its sequence, mask and the K/V blocks it visits: [n_min, n_max) holds every
// key visible to one of its rows, less the blocks [hole_lo, hole_hi) that none of them sees (HSTU target rows
// see the history and their own groups, not the targets in between: Mask::key_hole). Planned identically by
// the producer and the consumers, which walk the blocks in the same order: next_block.
struct TileWork {
  TileCoord coord;
  detail::SequenceInfo seq;
  detail::Mask mask;      // HSTU only
  detail::Window32 window;  // softmax only: its mask, a window
  int64_t m0 = 0;  // first query row of the tile within its sequence
  int n_min = 0, n_max = 0;
  int hole_lo = 0, hole_hi = 0;  // n_min < hole_lo <= hole_hi < n_max, or both 0
  int split = 0;                 // split-KV: the key chunk of the tile (keep_split); 0 otherwise

  // Softmax masks are windows only (supports() refuses contexts and targets), planned in 32 bits (mask.h's
  // Window32) from the kernel's normalised bounds `left` and `right`; HSTU plans with the full Mask.
  // kPackGqa: m0 is the first query row the tile touches (unpack_row of its first packed row), `pack` = g.
  template <int kBlockM, int kBlockN, bool kHstu, bool kPackGqa = false>
  CUTEATTN_HD static TileWork plan(const detail::Params& p, TileCoord c, int pack, int left, int right) {
    TileWork w;
    w.coord = c;
    w.seq = detail::SequenceInfo::of(p, c.batch);
    int m0, span;  // the tile's first query row and the rows from it to its last one (some may lie past the sequence)
    if constexpr (kPackGqa) {
      m0 = unpack_row(c.m_block * kBlockM, pack).row;
      span = unpack_row(c.m_block * kBlockM + kBlockM - 1, pack).row + 1 - m0;
    } else {
      m0 = c.m_block * kBlockM;
      span = kBlockM;
    }
    w.m0 = m0;
    if constexpr (!kHstu) {
      w.window = {int(w.seq.sq), int(w.seq.sk), left, right};
      if (m0 < w.window.sq) {
        // Rows past the sequence see nothing (m0 + span may pass 2^31 where the sequence ends near it).
        const int m_end = w.window.sq - m0 > span ? m0 + span : w.window.sq;
        int begin, end;
        w.window.key_range(m0, m_end, &begin, &end);
        if (begin < end) {
          w.n_min = begin / kBlockN;
          w.n_max = int((uint32_t(end) + uint32_t(kBlockN - 1)) / uint32_t(kBlockN));
        }
      }
    } else {
      w.mask = detail::Mask::of(p, w.seq, c.batch);
      if (w.m0 < w.seq.sq) {
        const int64_t m_end = w.m0 + span;
        const detail::Range keys = w.mask.key_range(w.m0, m_end);
        if (!keys.empty()) {
          w.n_min = int(keys.begin / kBlockN);
          w.n_max = int((keys.end + kBlockN - 1) / kBlockN);
        }
        // The hole lies below the block of the tile's last key (its own group is visible to it); a hole that
        // starts at n_min just moves n_min.
        const detail::Range hole = detail::blocks_inside(w.mask.key_hole(w.m0, m_end), kBlockN);
        const int lo = hole.begin > w.n_min ? int(hole.begin) : w.n_min;
        const int hi = hole.end < w.n_max ? int(hole.end) : w.n_max;
        if (lo < hi) {
          if (lo == w.n_min) {
            w.n_min = hi;
          } else {
            w.hole_lo = lo;
            w.hole_hi = hi;
          }
        }
      }
    }
    return w;
  }
  // Split-KV (softmax, no hole): keeps the blocks of chunk `s` of the sequence's key blocks cut into `num_splits`
  // contiguous chunks of ceil(blocks / num_splits); a chunk outside [n_min, n_max) leaves the tile no key.
  template <int kBlockN>
  CUTEATTN_HD void keep_split(int s, int num_splits) {
    split = s;
    const int blocks = int((seq.sk + kBlockN - 1) / kBlockN);
    const int per = (blocks + num_splits - 1) / num_splits;
    const int lo = s * per, hi = lo + per;
    n_min = n_min > lo ? n_min : lo;
    n_max = n_max < hi ? n_max : hi;
    if (n_min >= n_max) n_min = n_max = 0;
  }
  // Blocks run from n_max - 1 down to n_min (the masked diagonal under causal first); the block after n,
  // below n_min when n was the last.
  CUTEATTN_HD int next_block(int n) const { return n == hole_hi ? hole_lo - 1 : n - 1; }
  CUTEATTN_HD int num_blocks() const { return n_max - n_min - (hole_hi - hole_lo); }
  // The tile holds rows of its sequence (tiles past a short varlen sequence hold none).
  CUTEATTN_HD bool has_rows() const { return m0 < seq.sq; }
  // Its rows see at least one key; otherwise they get O = 0, LSE = -inf without touching K/V.
  CUTEATTN_HD bool has_keys() const { return n_max > n_min; }
};

}  // namespace cuteattn::sm90
