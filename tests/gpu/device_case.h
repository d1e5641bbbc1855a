// Device copies of a test Case for the GPU suites: uploads the buffers one pass reads and writes (outputs with
// the NaN poison the Case carries, so unwritten elements show), builds ForwardArgs/BackwardArgs whose data
// pointers are those copies, and copies outputs back into the Case. Also the forward round trip every GPU
// forward suite runs: fresh random case, GPU forward, out (and LSE) against the float64 oracle.
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
  // Poisons dq, dk, dv, drab on the host and uploads them again.
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
  void to_device(Problem& p) const;

  Case& c_;
  Backend backend_;
  std::vector<Buffer> buffers_;
};

// Runs the forward of `backend` on a fresh random case of `cfg` through a DeviceCase (with `batch_stride`) and
// checks out, and LSE for softmax, against the float64 oracle under the forward factor.
void check_forward_on_device(const CaseConfig& cfg, Backend backend, int64_t batch_stride = 0);

}  // namespace cuteattn::test
