// Entry point of the sm80 backward family (what the generated instances instantiate): which problems an
// instance serves, the workspace it needs, and the launch sequence
//   [D = rowsum(dO * O) | dRab zero-fill | zeroing the visible part of the dRab accumulator] -> main dK/dV/dQ
//   kernel -> dQ (and atomically head-summed dRab) conversion.
// Workspace: fp32 dQ accumulators (one copy per split in deterministic mode, each whole kBlockM x kHeadDim
// tiles in the dQ MMA's thread order: sm80_bwd::DqTiles), D (softmax), and for HSTU with one
// rab head shared by several query heads an fp32 (b, max_sk, max_sk rounded to even) dRab accumulator: in
// deterministic mode partial head sums that one CTA per key block carries from head to head (its last head writes
// dRab), else the target of atomics from every head, converted by a pass after the main kernel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/device_properties.h"
#include "core/params.h"
#include "cuteattn/attention.h"
#include "sm80/backward_aux_sm80.cuh"
#include "sm80/backward_kernel_sm80.cuh"
#include "sm80/backward_traits_sm80.cuh"

namespace cuteattn::detail {

template <ScoreFunction kScore, DType kDType, int kHeadDim>
struct Sm80Backward {
  static constexpr bool kHstu = kScore == ScoreFunction::kHstuSilu;
  static constexpr bool kCompiled =
      kDType == DType::kFloat16 || kDType == DType::kBFloat16 || (kDType == DType::kFloat32 && !kHstu);

  // How the work is cut and where each scratch buffer lies in the workspace.
  struct Plan {
    int n_blocks = 0, nsplit = 1, heads_per_cta = 1, kv_group = 1;
    size_t dq_offset = 0, dq_split_elems = 0, dsum_offset = 0, drab_offset = 0, total = 0;
    int64_t drab_ld = 0;
    bool drab_accum = false, drab_walk = false, heads_inner = false;
  };

  static size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

  // The A100 configuration (163 KB of shared memory per CTA), and the one for devices that give a CTA 227 KB
  // (sm90), launched where it differs (softmax fp16/bf16 d = 256: Q/dO double-buffered, 2 x 4 dQ warps).
  using TraitsSm80 = sm80_bwd::BwdTraits<kDType, kHeadDim, kHstu>;
  using TraitsLarge = sm80_bwd::BwdTraits<kDType, kHeadDim, kHstu, 227 * 1024>;
  static constexpr bool kLargeDiffers = TraitsLarge::kStages != TraitsSm80::kStages;
  static_assert(TraitsLarge::kBlockM == TraitsSm80::kBlockM && TraitsLarge::kDqChunks == TraitsSm80::kDqChunks);

  static int block_n() {
    if constexpr (kCompiled) {
      return sm80_bwd::BwdTraits<kDType, kHeadDim, kHstu>::kBlockN;
    } else {
      return 1;
    }
  }

  static Plan plan(const Params& p) {
    Plan pl;
    pl.n_blocks = int((p.seqlen_k + block_n() - 1) / block_n());
    pl.kv_group = p.heads_k > 0 ? int(p.heads / p.heads_k) : 1;
    pl.drab_accum = kHstu && p.drab != nullptr && p.rab_heads == 1 && p.heads > 1;
    // Deterministic dRab summed over heads: one CTA walks all heads of a key block in order. Otherwise every head
    // adds with atomics: on an H100 (HSTU d128, max 1k / 4k) the walk measured no faster than scalar atomics did.
    pl.drab_walk = pl.drab_accum && p.deterministic;
    pl.drab_ld = (p.seqlen_k + 1) / 2 * 2;
    pl.heads_per_cta = pl.drab_walk ? int(p.heads) : pl.kv_group;
    // One rab head shared by all heads: the CTAs of one key block and batch entry for every head run next to each
    // other (x = split * head groups + group), so they read each rab tile from L2 together and their dRab atomics
    // meet there, instead of a head's pass over the batch entry evicting the tiles before the next head comes.
    pl.heads_inner = kHstu && p.rab != nullptr && p.rab_heads == 1 && p.heads > pl.heads_per_cta;
    pl.nsplit = pl.n_blocks;
    if (p.deterministic && pl.n_blocks > 0) {
      const int sms = DeviceProperties::of(p.device_index).sms;
      const int64_t ctas_yz = std::max<int64_t>(1, p.batch * (p.heads / pl.heads_per_cta));
      const int64_t want = (2 * int64_t(sms) + ctas_yz - 1) / ctas_yz;
      pl.nsplit = int(std::clamp<int64_t>(want, 1, std::min<int64_t>(pl.n_blocks, 32)));
    }
    const int nsplit_dq = p.deterministic ? pl.nsplit : 1;
    pl.dq_split_elems = size_t(sm80_bwd::DqTiles<TraitsSm80>::split_elems(p));  // TraitsLarge: the same tiles
    size_t off = 0;
    pl.dq_offset = off;
    off = align_up(off + size_t(nsplit_dq) * pl.dq_split_elems * sizeof(float));
    pl.dsum_offset = off;
    if (!kHstu) off = align_up(off + size_t(p.heads) * size_t(p.total_q) * sizeof(float));
    pl.drab_offset = off;
    if (pl.drab_accum) off = align_up(off + size_t(p.batch) * size_t(p.seqlen_k) * size_t(pl.drab_ld) * sizeof(float));
    pl.total = off;
    return pl;
  }

  // Elements per 16-byte vector (8 for fp16/bf16, 4 for fp32).
  static constexpr int64_t kVec = kDType == DType::kFloat32 ? 4 : 8;

  static bool aligned(const RowMajorView& t) {
    return reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && t.row_stride % kVec == 0 && t.head_stride % kVec == 0 &&
           t.batch_stride % kVec == 0;
  }

  static Status supports(const Params& p) {
    if constexpr (!kCompiled) {
      return Status::NotSupported("sm80 backward: HSTU kernels exist for float16 and bfloat16 only");
    } else {
      if (p.score != kScore || p.dtype != kDType) return Status::NotSupported("sm80 backward: wrong instance");
      if (p.head_dim > kHeadDim || p.head_dim_v > kHeadDim) {
        return Status::NotSupported("sm80 backward: head dim above the bucket " + std::to_string(kHeadDim));
      }
      if (p.head_dim % kVec != 0 || p.head_dim_v % kVec != 0) {
        return Status::NotSupported("sm80 backward: head dims must be multiples of " + std::to_string(kVec));
      }
      for (const RowMajorView* t : {&p.q, &p.k, &p.v, &p.dout, &p.dk, &p.dv}) {
        if (!aligned(*t)) {
          return Status::NotSupported("sm80 backward: q/k/v/dout/dk/dv need 16-byte aligned rows (strides % " +
                                      std::to_string(kVec) + " == 0)");
        }
      }
      if (!kHstu && !aligned(p.o)) return Status::NotSupported("sm80 backward: out needs 16-byte aligned rows");
      if (p.batch > 65535 || p.heads > 65535) return Status::NotSupported("sm80 backward: batch or heads above 65535");
      if (kHstu && p.heads_k != p.heads) return Status::NotSupported("sm80 backward: HSTU needs heads_k == heads");
      // rab is read as 32-bit column pairs.
      if (kHstu && p.rab != nullptr &&
          (reinterpret_cast<uintptr_t>(p.rab) % 4 != 0 || p.rab_row_stride % 2 != 0 || p.rab_head_stride % 2 != 0 ||
           p.rab_batch_stride % 2 != 0)) {
        return Status::NotSupported("sm80 backward: rab rows must be 4-byte aligned");
      }
      if (DeviceProperties::of(p.device_index).smem_optin < sm80_bwd::BwdTraits<kDType, kHeadDim, kHstu>::kSmemBytes) {
        return Status::NotSupported("sm80 backward: the device has too little shared memory for head dim " +
                                    std::to_string(kHeadDim));
      }
      return Status::Ok();
    }
  }

  static size_t workspace_bytes(const Params& p) { return kCompiled ? plan(p).total : 0; }

  static Status launch(const Params& p, void* workspace) {
    if constexpr (!kCompiled) {
      return Status::NotSupported("sm80 backward: HSTU kernels exist for float16 and bfloat16 only");
    } else {
      using Traits = TraitsSm80;
      using Element = typename Traits::Element;
      const Plan pl = plan(p);
      cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
      char* ws = static_cast<char*>(workspace);
      const int nsplit_dq = p.deterministic ? pl.nsplit : 1;

      sm80_bwd::BwdKernelArgs args;
      args.p = p;
      args.dq_accum = reinterpret_cast<float*>(ws + pl.dq_offset);
      args.dq_split_stride = int64_t(pl.dq_split_elems);
      args.dsum = kHstu ? nullptr : reinterpret_cast<float*>(ws + pl.dsum_offset);
      args.drab_accum = pl.drab_accum ? reinterpret_cast<float*>(ws + pl.drab_offset) : nullptr;
      args.drab_ld = pl.drab_ld;
      args.n_blocks = pl.n_blocks;
      args.nsplit = pl.nsplit;
      args.heads_per_cta = pl.heads_per_cta;
      args.kv_group = pl.kv_group;
      args.drab_walk = pl.drab_walk;
      args.heads_inner = pl.heads_inner;

      const int kAuxThreads = 256;
      auto aux_blocks = [](int64_t work) { return int(std::clamp<int64_t>((work + 255) / 256, 1, 8192)); };
      cudaError_t err = cudaMemsetAsync(args.dq_accum, 0, size_t(nsplit_dq) * pl.dq_split_elems * sizeof(float), stream);
      const bool drab_atomic = pl.drab_accum && !pl.drab_walk;
      if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("sm80 backward: ") + cudaGetErrorString(err)};
      // dRab passes: over the (row, rab head, batch entry) rows of dRab (drab_rows_grid).
      const dim3 drab_grid = sm80_bwd::drab_rows_grid(p, p.rab_heads);
      const bool drab_rows = p.seqlen_k > 0 && p.batch > 0;
      if (drab_atomic && drab_rows) {
        sm80_bwd::zero_drab_accum_kernel<<<sm80_bwd::drab_rows_grid(p, 1), sm80_bwd::kDrabThreads, 0, stream>>>(
            p, args.drab_accum, pl.drab_ld);
      }
      if constexpr (!kHstu) {
        if (p.total_q > 0) {
          sm80_bwd::dot_do_o_kernel<Element, kHeadDim>
              <<<aux_blocks(p.total_q * p.heads * kHeadDim / 8), kAuxThreads, 0, stream>>>(p, const_cast<float*>(args.dsum));
        }
      } else {
        if (p.drab != nullptr && !drab_atomic && drab_rows) {  // zeros where no query block sees the keys
          const int64_t sk2 = p.seqlen_k * p.seqlen_k;
          const bool dense = p.drab_row_stride == p.seqlen_k && p.drab_head_stride == sk2 &&
                             p.drab_batch_stride == p.rab_heads * sk2;
          if (dense) {
            err = cudaMemsetAsync(p.drab, 0, size_t(p.batch * p.rab_heads * sk2) * sizeof(Element), stream);
          } else {
            sm80_bwd::write_drab_kernel<Element><<<drab_grid, sm80_bwd::kDrabThreads, 0, stream>>>(p, nullptr, 0);
          }
        }
      }
      if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("sm80 backward: ") + cudaGetErrorString(err)};

      // The main kernel, then dQ read back with its dQ MMA partition (zeros where no key block ran).
      auto run = [&](auto traits) {
        using T = decltype(traits);
        if (pl.n_blocks > 0) {
          const unsigned head_groups = unsigned(p.heads / pl.heads_per_cta);
          const dim3 grid = pl.heads_inner ? dim3(pl.nsplit * head_groups, unsigned(p.batch), 1)
                                           : dim3(pl.nsplit, unsigned(p.batch), head_groups);
          auto kernel = sm80_bwd::bwd_kernel<T, kHstu>;
          err = opt_in_shared_memory<T>(kernel, T::kSmemBytes, p.device_index);
          if (err == cudaSuccess) kernel<<<grid, T::kNThreads, T::kSmemBytes, stream>>>(args);
        }
        if (err == cudaSuccess && p.total_q > 0) {
          const dim3 convert_grid(unsigned((p.seqlen_q + T::kBlockM - 1) / T::kBlockM), unsigned(p.heads),
                                  unsigned(p.batch));
          sm80_bwd::convert_dq_tiles_kernel<T><<<convert_grid, T::kNThreads, 0, stream>>>(
              p, args.dq_accum, args.dq_split_stride, nsplit_dq, kHstu ? 1.0f : p.scale);
        }
      };
      if (p.batch > 0) {
        if constexpr (kLargeDiffers) {
          if (DeviceProperties::of(p.device_index).smem_optin >= TraitsLarge::kSmemBytes) {
            run(TraitsLarge{});
          } else {
            run(TraitsSm80{});
          }
        } else {
          run(TraitsSm80{});
        }
        if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("sm80 backward: ") + cudaGetErrorString(err)};
      }

      if (drab_atomic && drab_rows) {
        sm80_bwd::write_drab_kernel<Element>
            <<<drab_grid, sm80_bwd::kDrabThreads, 0, stream>>>(p, args.drab_accum, pl.drab_ld);
      }
      err = cudaGetLastError();
      if (err != cudaSuccess) return {StatusCode::kCudaError, std::string("sm80 backward: ") + cudaGetErrorString(err)};
      return Status::Ok();
    }
  }
};

}  // namespace cuteattn::detail
