// Device copies of a test Case for the GPU suites: uploads the buffers one pass reads and writes (outputs with
// the NaN poison the Case carries, so unwritten elements show), builds ForwardArgs/BackwardArgs whose data
// pointers are those copies, and copies outputs back into the Case. Also the round trips the GPU suites run:
// fresh random case, GPU forward (out and LSE) or backward (gradients, optionally repeated for determinism)
// against the float64 oracle; and whether the device is a Hopper.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/test_util.h"
#include "cuteattn/attention.h"

namespace cuteattn::test {

class DeviceCase {
 public:
  // kForward: q, k, v, rab, cu_seqlens_q/k, num_contexts, num_targets, out, lse.
  // kBackward: those and dout, dq, dk, dv, drab.
  enum class Pass { kForward, kBackward };

  // Absent and zero-element tensors get no buffer (a null data pointer). batch_stride > 0 (fixed layout only)
  // places batch i of q, k, v, out, dout, dq, dk, dv at element i * batch_stride of its device buffer.
  DeviceCase(Case& c, Backend backend, Pass pass, int64_t batch_stride = 0);
  ~DeviceCase();
  DeviceCase(const DeviceCase&) = delete;
  DeviceCase& operator=(const DeviceCase&) = delete;

  // The Case's args for `backend` on the device.
  ForwardArgs forward_args();
  BackwardArgs backward_args(bool deterministic);

  // Copies a device buffer back into its host tensor (nothing for an absent or empty one).
  void download(HostTensor& t);
  void download_forward();    // out, lse; stops at the first failed copy
  void download_gradients();  // dq, dk, dv, drab
  // Poisons the device copies of out and lse, respectively dq, dk, dv and drab (the host tensors keep their
  // values until the next download).
  void poison_forward();
  void poison_gradients();

 private:
  struct Buffer {
    HostTensor* host;
    void* ptr;
    int64_t batch_stride;  // elements; 0: contiguous copy of the host tensor
  };
  const Buffer* find(const HostTensor& t) const;
  // Copies `t` to or from its device buffer (an error when it has none).
  cudaError_t transfer(HostTensor& t, cudaMemcpyKind kind) const;
  void bind(Tensor& t, const HostTensor& h) const;  // data (and batch stride) of the device copy
  void poison_device(const HostTensor& t) const;     // all bits set: NaN in every floating dtype
  void to_device(Problem& p) const;

  Case& c_;
  Backend backend_;
  std::vector<Buffer> buffers_;
};

// Whether the current CUDA device is a Hopper (sm_90) GPU, which the sm90 kernels need.
bool is_hopper();

// Runs the forward of `backend` on a fresh random case of `cfg` through a DeviceCase (with `batch_stride`) and
// checks out, and LSE for softmax, against the float64 oracle under the forward factor. The yardstick of fp32
// cases is the plain tf32 computation (plain_forward_tf32 / plain_backward_tf32), also for the backward.
void check_forward_on_device(const CaseConfig& cfg, Backend backend, int64_t batch_stride = 0);

// Where a softmax backward's O and LSE come from: the CPU tiled forward, or the GPU forward of the same backend.
enum class ForwardOn { kCpu, kGpu };

// Runs the backward of `backend` on a fresh random case of `cfg` and checks dQ, dK, dV (and dRab) against the
// float64 oracle under the gradient factor; then runs it `repeats` more times (gradients poisoned before each
// run) and demands the first run's bits every time.
void check_backward_on_device(const CaseConfig& cfg, Backend backend, bool deterministic = false, int repeats = 0,
                              ForwardOn fwd = ForwardOn::kCpu);

}  // namespace cuteattn::test
