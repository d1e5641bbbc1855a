// Entry point of the sm80 forward kernels for the generated instances: Sm80Forward<score, dtype, head dim>
// says which problems one compiled instance serves, and launches it on the problem's stream.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>

#include "core/device_properties.h"
#include "core/params.h"
#include "cuteattn/attention.h"
#include "cuteattn/types.h"
#include "sm80/forward_kernel_sm80.cuh"
#include "sm80/kernel_traits_fwd_sm80.cuh"

namespace cuteattn::detail {

template <DType kDType>
struct Sm80Element;
template <>
struct Sm80Element<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct Sm80Element<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct Sm80Element<DType::kFloat32> {
  using type = float;  // the MMAs read it as tf32
};

template <ScoreFunction kScore, DType kDType, int kHeadDim>
struct Sm80Forward {
  static constexpr bool kHstu = kScore == ScoreFunction::kHstuSilu;
  static_assert(!(kHstu && kDType == DType::kFloat32), "HSTU runs in fp16/bf16 only");
  using Traits = sm80::ForwardTraits<typename Sm80Element<kDType>::type, kHeadDim, kHstu>;
  // The 16-bit softmax d 256 bucket has a second tile for short masked rows (kernel_traits_fwd_sm80.cuh); it needs
  // less shared memory than Traits, so supports() checks Traits.
  static constexpr bool kHasShortRowsTile = sm80::has_short_rows_tile(kHeadDim, kHstu, kDType == DType::kFloat32);
  using ShortRowsTraits = sm80::ForwardTraits<typename Sm80Element<kDType>::type, kHeadDim, kHstu, kHasShortRowsTile>;
  // Masked on the right (causal or a window) with at most this many keys per sequence: the 64-row tile's
  // diagonal blocks mask half the rows of the 128-row tile's, and two of its tiles share an SM.
  static constexpr int64_t kShortRowsMaxSeqlenK = 1024;
  static bool short_masked_rows(const Params& p) {
    return kHasShortRowsTile && p.window_right >= 0 && p.seqlen_k <= kShortRowsMaxSeqlenK;
  }

  static Status supports(const Params& p) {
    if (p.score != kScore || p.dtype != kDType) return Status::NotSupported("sm80 forward: score/dtype mismatch");
    if (p.head_dim > kHeadDim || p.head_dim_v > kHeadDim) {
      return Status::NotSupported("sm80 forward: head dim above the compiled bucket " + std::to_string(kHeadDim));
    }
    // 128-bit vector copies: head dims, strides and base pointers in whole 16-byte chunks.
    constexpr int64_t kVec = Traits::kGmemElemsPerLoad;
    if (p.head_dim % kVec != 0 || p.head_dim_v % kVec != 0) {
      return Status::NotSupported("sm80 forward: head dims must be multiples of " + std::to_string(kVec));
    }
    for (const RowMajorView* t : {&p.q, &p.k, &p.v, &p.o}) {
      if (reinterpret_cast<uintptr_t>(t->ptr) % 16 != 0 || t->row_stride % kVec != 0 ||
          t->head_stride % kVec != 0 || t->batch_stride % kVec != 0) {
        return Status::NotSupported("sm80 forward: q/k/v/out need 16-byte aligned pointers and strides");
      }
    }
    if (p.batch > 65535 || p.heads > 65535) return Status::NotSupported("sm80 forward: batch or heads above 65535");
    if (p.heads_k <= 0 || p.heads % p.heads_k != 0) return Status::NotSupported("sm80 forward: heads % heads_k");
    if (kHstu && p.rab != nullptr && p.rab_heads != 1 && p.rab_heads != p.heads) {
      return Status::NotSupported("sm80 forward: rab heads must be 1 or h");
    }
    // Dynamic tiles plus the kernel's static arrays (e.g. fp32 d = 128 needs more than sm86/89's 99 KB).
    if (DeviceProperties::of(p.device_index).smem_optin < Traits::kSmemBytes + Traits::kSmemStaticBytes) {
      return Status::NotSupported("sm80 forward: the device has too little shared memory for head dim " +
                                  std::to_string(kHeadDim));
    }
    return Status::Ok();
  }

  static size_t workspace_bytes(const Params&) { return 0; }

  static Status launch(const Params& p, void*) {
    if (p.seqlen_q == 0 || p.batch == 0 || p.heads == 0) return Status::Ok();
    return short_masked_rows(p) ? launch_with<ShortRowsTraits>(p) : launch_with<Traits>(p);
  }

  template <class T>
  static Status launch_with(const Params& p) {
    const int64_t m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    auto kernel = &sm80::forward_kernel_sm80<T>;
    constexpr int kSmem = T::kSmemBytes;
    cudaError_t err = opt_in_shared_memory<T>(kernel, kSmem, p.device_index);
    if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("sm80 forward: ") + cudaGetErrorString(err)};
    const dim3 grid(unsigned(m_blocks), unsigned(p.batch), unsigned(p.heads));
    kernel<<<grid, T::kNThreads, kSmem, static_cast<cudaStream_t>(p.stream)>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("sm80 forward: ") + cudaGetErrorString(err)};
    return Status::Ok();
  }
};

}  // namespace cuteattn::detail
