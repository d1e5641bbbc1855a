// HSTU score of the sm90 kernels on wgmma accumulators (SEMANTICS.md section 2): reads the rab tile from
// shared memory into the accumulator (Q K^T then accumulates onto it; HstuPointwise of cuda/hstu_pointwise.cuh
// turns u = qk + rab into P = silu(alpha * u) / scaling_seqlen); and the host-side check of what the rab / dRab
// TMA tiles need.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "core/params.h"
#include "cuda/hstu_pointwise.cuh"

namespace cuteattn::sm90 {

using namespace cute;
using detail::HstuPointwise;

// Why the sm90 kernels cannot take this HSTU call's heads, rab or dRab, or nullptr: h_k == h, rab heads 1 or h,
// and TMA tiles of rab and dRab (16-byte aligned bases, 16-byte multiple strides, 32-bit coordinates).
template <class Element>
const char* hstu_tma_refusal(const detail::Params& p) {
  if (p.heads_k != p.heads) return "HSTU needs h_k == h";
  if (p.rab == nullptr) return nullptr;
  constexpr int64_t kVec = 16 / sizeof(Element);
  auto aligned = [](const void* ptr, int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && row_stride % kVec == 0 && head_stride % kVec == 0 &&
           batch_stride % kVec == 0;
  };
  if (p.rab_heads != 1 && p.rab_heads != p.heads) return "rab heads must be 1 or h";
  if (!aligned(p.rab, p.rab_row_stride, p.rab_head_stride, p.rab_batch_stride))
    return "needs a 16-byte aligned rab with 16-byte multiple strides";
  if (p.drab != nullptr && !aligned(p.drab, p.drab_row_stride, p.drab_head_stride, p.drab_batch_stride))
    return "needs a 16-byte aligned drab with 16-byte multiple strides";
  if (p.seqlen_k >= (int64_t(1) << 31) || p.batch >= (int64_t(1) << 31)) return "rab beyond 32-bit TMA coordinates";
  return nullptr;
}

// Reads one stage of the rab ring straight into a warpgroup's S accumulator ((2, 2, kBlockN/8), 1, 1): value
// e + 2 h + 4 k of a thread is (row0 + 8 h, col0 + 8 k + e), (row0, col0) its first coordinate. The ring holds
// what TMA's 128-byte swizzle writes (SmemLayoutRab): 8-row x 64-column atoms of 128-byte rows, stacked along
// the rows first, each row's 16-byte chunk index XORed with row % 8. A thread's rows all have the same
// row % 8, so its 8 chunk addresses are one XOR each and every read is a 32-bit ld.shared at a constant
// offset from one of them (reads through CuTe's swizzled pointer were 64-bit generic loads with the
// swizzle computed per element).
template <class Element, int kBlockM, int kBlockN>
struct RabReader {
  static_assert(sizeof(Element) == 2 && kBlockN % 64 == 0 && kBlockM % 8 == 0);
  static constexpr uint32_t kStageBytes = kBlockM * kBlockN * sizeof(Element);
  static constexpr uint32_t kAtomBytes = 1024;  // 8 rows x 128 bytes
  uint32_t ring;    // shared address of the ring (1024-byte aligned)
  uint32_t thread;  // thread_offset(row0, col0)

  // (row0, col0) in chunk row0 % 8 (XOR (j << 4) moves to chunk j ^ (row0 % 8)).
  CUTE_HOST_DEVICE static constexpr uint32_t thread_offset(int row0, int col0) {
    return uint32_t(row0 / 8) * kAtomBytes + uint32_t(row0 % 8) * 128 + (uint32_t(row0 % 8) << 4) +
           uint32_t(col0) * sizeof(Element);
  }
  // Byte offset in the ring of values (4 k + 2 h, 4 k + 2 h + 1) of a thread, in `stage`.
  CUTE_HOST_DEVICE static constexpr uint32_t value_offset(uint32_t thread, int k, int h, int stage) {
    return (thread ^ uint32_t((k % 8) << 4)) + uint32_t(stage) * kStageBytes + uint32_t(h) * kAtomBytes +
           uint32_t(k / 8) * (kBlockM / 8) * kAtomBytes;
  }

  CUTE_DEVICE RabReader(Element const* ring_, int row0, int col0)
      : ring(uint32_t(cute::cast_smem_ptr_to_uint(ring_))), thread(thread_offset(row0, col0)) {}

  template <class TensorS>
  CUTE_DEVICE void load(TensorS& tSrS, int stage) const {
    static_assert(decltype(size(tSrS))::value == 4 * (kBlockN / 8));
    CUTE_UNROLL
    for (int k = 0; k < kBlockN / 8; ++k) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t bits;
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(bits) : "r"(ring + value_offset(thread, k, h, stage)));
        const auto pair = reinterpret_cast<cutlass::Array<Element, 2> const&>(bits);
        tSrS(4 * k + 2 * h) = float(pair[0]);
        tSrS(4 * k + 2 * h + 1) = float(pair[1]);
      }
    }
  }
};

}  // namespace cuteattn::sm90
