// The fp32 dQ workspace of the sm90 backward without a zero-fill, where the key blocks reach a query block one
// after the other: masks bounded on the right (causal, windows: key block n starts at a later query block than
// n - 1), and softmax d 128 without such a mask where s_q >= s_k, whose key block n walks the query blocks from
// its diagonal on, wrapping around (HeadsStepWalk). Each (query block, query head, column half) tile of the workspace
// has a state word: the first dQ writer warp to bring a contribution to a tile claims it, stores its part by TMA
// and then marks it written; every later contribution waits until the tile is written and adds itself by TMA
// reduce-add. A sequence's last, partial tile is zeroed and marked written beforehand (prepare_dq_tiles_kernel; a
// store of its whole tile would overwrite the next sequence's first rows), so every contribution adds there. The
// conversion pass reads the tiles that were written and writes zero dQ for the others (query blocks no key block
// reaches). What it saves: the zero-fill of the accumulator (4 bytes per element) and the reads of those zeros
// behind each tile's first reduce-add.
// Where all key blocks would start at the same query block (no right bound: HSTU, softmax d 64, s_q < s_k),
// their first contributions would meet on every tile and wait for each other (0.45-0.7x): those calls zero-fill
// the accumulator and every contribution adds.
// Rows of a partial tile past its sequence belong to the next sequence's first tile, if any: the reduce-adds add
// exact zeros there (the consumers' dQ rows past the sequence are zero), harmless before or after that tile's store.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "core/params.h"
#include "variants/sequence.h"

namespace cuteattn::sm90 {

struct DqTileStates {
  static constexpr uint32_t kUntouched = 0, kClaimed = 1, kWritten = 2;
  static constexpr int kHalves = 2;

  // The tiles of batch entry bi start at word row_base / kBlockM + bi (row_base: its first workspace row), so
  // every sequence's ceil(sq / kBlockM) tiles get words of their own: total_q / kBlockM + batch + 1 per head and
  // half cover them all.
  template <int kBlockM>
  CUTE_HOST_DEVICE static int64_t count(int64_t total_q, int64_t batch, int64_t heads) {
    return (total_q / kBlockM + batch + 1) * heads * kHalves;
  }
  template <int kBlockM>
  CUTE_HOST_DEVICE static int64_t index(int64_t row_base, int64_t bi, int64_t m, int64_t head, int64_t heads,
                                        int half) {
    return ((row_base / kBlockM + bi + m) * heads + head) * kHalves + half;
  }
};

CUTE_DEVICE uint32_t load_relaxed_gpu(const uint32_t* word) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
  return v;
}
CUTE_DEVICE void store_release_gpu(uint32_t* word, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(word), "r"(v) : "memory");
}
// Orders this thread's generic and async-proxy (TMA) accesses of global memory.
CUTE_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// In a dQ writer warp (every lane), once the tile's contribution is staged: whether it is the tile's first (the
// warp then stores it); otherwise returns once the first is written. `seen`: the state read before the staging
// hand-over (most contributions find the tile written and need no atomic).
// The state words are read relaxed: an acquire load at gpu scope invalidates the SM's L1 (CCTL.IVALL), every step.
// Ordering holds without it: the first contribution's store is complete at L2 before its state says written
// (publish_stored_dq), the reduce-add behind a written state is issued only once that state is read, and it is
// performed at L2, where the store already is; the proxy fence keeps the warp's TMA operation behind its generic
// read.
CUTE_DEVICE bool claim_first_dq(uint32_t* word, uint32_t seen) {
  uint32_t first = 0;
  if (cutlass::canonical_lane_idx() == 0) {
    uint32_t state = seen;
    if (state != DqTileStates::kWritten) state = atomicCAS(word, DqTileStates::kUntouched, DqTileStates::kClaimed);
    first = state == DqTileStates::kUntouched;
    if (!first) {
      while (state != DqTileStates::kWritten) {
        __nanosleep(32);
        state = load_relaxed_gpu(word);
      }
      fence_proxy_async_global();
    }
  }
  return __shfl_sync(0xffffffffu, first, 0) != 0;
}

// A tile's first contribution, its TMA store issued: once the store is complete, the tile is written (lane 0 of
// the writer warp, at once: publishing it a step later, while the warp waits for the consumers, measured no faster
// and leaves the tile claimed for longer).
CUTE_DEVICE void publish_stored_dq(uint32_t* word) {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  fence_proxy_async_global();
  store_release_gpu(word, DqTileStates::kWritten);
}

// Before the main kernel, one CTA per batch entry: the state words of the entry's tiles zeroed but for its last
// tile when that is partial, whose rows in the sequence are zeroed in the workspace and whose words say written.
template <int kHeadDim, int kBlockM>
__global__ void prepare_dq_tiles_kernel(const __grid_constant__ detail::Params p, float* dq_accum, uint32_t* states) {
  const int64_t bi = blockIdx.x;
  const detail::SequenceInfo seq = detail::SequenceInfo::of(p, bi);
  const int64_t base = seq.first_q_row(p, bi);
  const int64_t full = seq.sq / kBlockM;  // tiles whose rows all lie in the sequence
  const int64_t words_per_tile = p.heads * DqTileStates::kHalves;
  const int64_t words = (seq.sq + kBlockM - 1) / kBlockM * words_per_tile;
  uint32_t* tile_states = states + DqTileStates::index<kBlockM>(base, bi, 0, 0, p.heads, 0);
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
    tile_states[i] = i / words_per_tile < full ? DqTileStates::kUntouched : DqTileStates::kWritten;
  // The partial tile's rows: (rows, h, kHeadDim) floats in one piece.
  const int64_t vectors = (seq.sq - full * kBlockM) * p.heads * kHeadDim / 4;
  float4* rows = reinterpret_cast<float4*>(dq_accum + (base + full * kBlockM) * p.heads * kHeadDim);
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) rows[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// dq[row, h, c] = scale * workspace[row, h, Columns::physical(c)] for the tiles written (every tile where `states`
// is null: the accumulator was zero-filled), 0 for the others. One CTA of kConvertThreads per (query block, head)
// of a batch entry: blockIdx.x = m * heads + head, blockIdx.y = batch entry; a thread converts 4 consecutive
// columns of a row at a time, all its loads issued together.
constexpr int kConvertThreads = 256;
template <class Element, int kHeadDim, int kBlockM, class Columns>
__global__ void __launch_bounds__(kConvertThreads)
    convert_dq_tiles_kernel(const __grid_constant__ detail::Params p, const float* dq_accum, const uint32_t* states,
                            float scale) {
  constexpr int kChunks = kHeadDim / 4;
  constexpr int kHalfCols = kHeadDim / DqTileStates::kHalves;
  static_assert(kBlockM * kChunks % kConvertThreads == 0 && DqTileStates::kHalves == 2);
  const int64_t bi = blockIdx.y;
  const int64_t m = blockIdx.x / p.heads, head = blockIdx.x % p.heads;
  const detail::SequenceInfo seq = detail::SequenceInfo::of(p, bi);
  const int64_t row0 = m * kBlockM;
  if (row0 >= seq.sq) return;
  const int rows = int(seq.sq - row0 < kBlockM ? seq.sq - row0 : kBlockM);
  const int64_t base = seq.first_q_row(p, bi);
  auto written = [&](int half) {
    return states == nullptr ||
           states[DqTileStates::index<kBlockM>(base, bi, m, head, p.heads, half)] == DqTileStates::kWritten;
  };
  const bool written0 = written(0), written1 = written(1);
  const int c = threadIdx.x % kChunks * 4;
  if (c >= p.head_dim) return;
  const bool read = c < kHalfCols ? written0 : written1;
  float4 acc[kBlockM * kChunks / kConvertThreads];
  CUTE_UNROLL
  for (int it = 0; it < kBlockM * kChunks / kConvertThreads; ++it) {
    const int r = (it * kConvertThreads + int(threadIdx.x)) / kChunks;
    acc[it] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (read && r < rows)
      acc[it] = *reinterpret_cast<const float4*>(dq_accum + ((base + row0 + r) * p.heads + head) * kHeadDim +
                                                 Columns::physical(c));
  }
  CUTE_UNROLL
  for (int it = 0; it < kBlockM * kChunks / kConvertThreads; ++it) {
    const int r = (it * kConvertThreads + int(threadIdx.x)) / kChunks;
    if (r >= rows) continue;
    Element* dst = static_cast<Element*>(p.dq.ptr) + (p.varlen ? 0 : bi * p.dq.batch_stride) +
                   (p.varlen ? base + row0 + r : row0 + r) * p.dq.row_stride + head * p.dq.head_stride + c;
    dst[0] = static_cast<Element>(acc[it].x * scale);
    dst[1] = static_cast<Element>(acc[it].y * scale);
    dst[2] = static_cast<Element>(acc[it].z * scale);
    dst[3] = static_cast<Element>(acc[it].w * scale);
  }
}

}  // namespace cuteattn::sm90
