// DeviceCase (upload, args, download of a test Case's buffers) and the shared GPU forward and backward round
// trips.
#include "gpu/device_case.h"

#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace cuteattn::test {
namespace {

bool batch_strided(const HostTensor* t, const Case& c) {
  for (const HostTensor* s : {&c.q, &c.k, &c.v, &c.out, &c.dout, &c.dq, &c.dk, &c.dv})
    if (s == t) return true;
  return false;
}

// Elements of one batch of a fixed-layout tensor.
int64_t batch_numel(const HostTensor& t) { return t.numel() / t.shape[0]; }

size_t device_bytes(const HostTensor& t, int64_t batch_stride) {
  if (batch_stride == 0) return t.bytes.size();
  return static_cast<size_t>(batch_stride * (t.shape[0] - 1) + batch_numel(t)) * dtype_size(t.dtype);
}

// Copies between a host tensor and its device buffer, batch by batch when the device side is strided;
// every batch is attempted, the first error is returned.
cudaError_t copy(HostTensor& host, void* device, int64_t batch_stride, cudaMemcpyKind kind) {
  if (batch_stride == 0) {
    return kind == cudaMemcpyHostToDevice ? cudaMemcpy(device, host.data(), host.bytes.size(), kind)
                                          : cudaMemcpy(host.data(), device, host.bytes.size(), kind);
  }
  const size_t esize = dtype_size(host.dtype);
  const size_t batch_bytes = static_cast<size_t>(batch_numel(host)) * esize;
  cudaError_t first = cudaSuccess;
  for (int64_t bi = 0; bi < host.shape[0]; ++bi) {
    char* h = static_cast<char*>(host.data()) + bi * batch_bytes;
    char* d = static_cast<char*>(device) + bi * batch_stride * esize;
    const cudaError_t e =
        kind == cudaMemcpyHostToDevice ? cudaMemcpy(d, h, batch_bytes, kind) : cudaMemcpy(h, d, batch_bytes, kind);
    if (first == cudaSuccess) first = e;
  }
  return first;
}

}  // namespace

DeviceCase::DeviceCase(Case& c, Backend backend, Pass pass, int64_t batch_stride) : c_(c), backend_(backend) {
  std::vector<HostTensor*> tensors = {
      &c.q, &c.k, &c.v, &c.rab, &c.cu_seqlens_q, &c.cu_seqlens_k, &c.num_contexts, &c.num_targets, &c.out, &c.lse};
  if (pass == Pass::kBackward) tensors.insert(tensors.end(), {&c.dout, &c.dq, &c.dk, &c.dv, &c.drab});
  for (HostTensor* t : tensors) {
    buffers_.push_back({t, nullptr, batch_strided(t, c) ? batch_stride : 0});
    if (!t->empty() && t->numel() > 0) {
      const size_t bytes = device_bytes(*t, buffers_.back().batch_stride);
      EXPECT_EQ(cudaMalloc(&buffers_.back().ptr, bytes), cudaSuccess) << "could not allocate " << bytes << " bytes";
      EXPECT_EQ(transfer(*t, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
}

DeviceCase::~DeviceCase() {
  for (const Buffer& b : buffers_) cudaFree(b.ptr);
}

const DeviceCase::Buffer* DeviceCase::find(const HostTensor& t) const {
  for (const Buffer& b : buffers_)
    if (b.host == &t) return &b;
  return nullptr;
}

cudaError_t DeviceCase::transfer(HostTensor& t, cudaMemcpyKind kind) const {
  const Buffer* b = find(t);
  return b ? copy(t, b->ptr, b->batch_stride, kind) : cudaErrorInvalidValue;
}

void DeviceCase::bind(Tensor& t, const HostTensor& h) const {
  const Buffer* b = find(h);
  t.data = b ? b->ptr : nullptr;
  if (b && b->batch_stride != 0) t.stride[0] = b->batch_stride;
}

void DeviceCase::to_device(Problem& p) const {
  p.device = DeviceKind::kCuda;
  const std::pair<Tensor*, const HostTensor*> inputs[] = {
      {&p.q, &c_.q}, {&p.k, &c_.k}, {&p.v, &c_.v}, {&p.rab, &c_.rab},
      {&p.cu_seqlens_q, &c_.cu_seqlens_q}, {&p.cu_seqlens_k, &c_.cu_seqlens_k},
      {&p.num_contexts, &c_.num_contexts}, {&p.num_targets, &c_.num_targets}};
  for (const auto& [t, h] : inputs) bind(*t, *h);
}

ForwardArgs DeviceCase::forward_args() {
  ForwardArgs a = c_.forward_args(backend_);
  to_device(a.problem);
  bind(a.out, c_.out);
  if (a.lse.defined()) bind(a.lse, c_.lse);
  return a;
}

BackwardArgs DeviceCase::backward_args(bool deterministic) {
  BackwardArgs a = c_.backward_args(backend_);
  to_device(a.problem);
  if (a.out.defined()) bind(a.out, c_.out);
  if (a.lse.defined()) bind(a.lse, c_.lse);
  const std::pair<Tensor*, const HostTensor*> grads[] = {
      {&a.dout, &c_.dout}, {&a.dq, &c_.dq}, {&a.dk, &c_.dk}, {&a.dv, &c_.dv}, {&a.drab, &c_.drab}};
  for (const auto& [t, h] : grads) bind(*t, *h);
  a.deterministic = deterministic;
  return a;
}

void DeviceCase::download(HostTensor& t) {
  if (t.empty() || t.numel() == 0) return;
  ASSERT_EQ(transfer(t, cudaMemcpyDeviceToHost), cudaSuccess);
}

void DeviceCase::download_forward() {
  for (HostTensor* t : {&c_.out, &c_.lse}) {
    if (t->empty() || t->numel() == 0) continue;
    ASSERT_EQ(transfer(*t, cudaMemcpyDeviceToHost), cudaSuccess);
  }
}

void DeviceCase::download_gradients() {
  for (HostTensor* t : {&c_.dq, &c_.dk, &c_.dv, &c_.drab}) download(*t);
}

void DeviceCase::poison_device(const HostTensor& t) const {
  const Buffer* b = find(t);
  if (b == nullptr || b->ptr == nullptr) return;
  EXPECT_EQ(cudaMemset(b->ptr, 0xff, device_bytes(t, b->batch_stride)), cudaSuccess);
}

void DeviceCase::poison_forward() {
  for (const HostTensor* t : {&c_.out, &c_.lse}) poison_device(*t);
}

void DeviceCase::poison_gradients() {
  for (const HostTensor* t : {&c_.dq, &c_.dk, &c_.dv, &c_.drab}) poison_device(*t);
}

void check_forward_on_device(const CaseConfig& cfg, Backend backend, int64_t batch_stride) {
  SCOPED_TRACE(cfg.describe());
  Case c = Case::make(cfg, test_seed());
  Case ref = c.fp32_copy();
  ASSERT_TRUE(run_forward(ref, Backend::kCpuReference));
  Case plain = c.fresh_copy();
  if (cfg.dtype == DType::kFloat32) {
    plain_forward_tf32(plain);  // the GPU kernels compute fp32 inputs with tf32 MMAs
  } else {
    plain_forward(plain);
  }

  {
    DeviceCase dc(c, backend, DeviceCase::Pass::kForward, batch_stride);
    const Status s = attention_forward(dc.forward_args());
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download_forward();
  }
  EXPECT_TRUE(check_close("out", c.out, plain.out, ref.out, kForwardFactor));
  if (cfg.score == ScoreFunction::kSoftmax) {
    EXPECT_TRUE(check_close("lse", c.lse, plain.lse, ref.lse, kForwardFactor));
  }
}

void check_backward_on_device(const CaseConfig& cfg, Backend backend, bool deterministic, int repeats,
                              ForwardOn fwd) {
  SCOPED_TRACE(cfg.describe() + (deterministic ? " deterministic" : ""));
  Case c = Case::make(cfg, test_seed());
  Case ref = c.fp32_copy();
  ASSERT_TRUE(run_forward(ref, Backend::kCpuReference));
  ASSERT_TRUE(run_backward(ref, Backend::kCpuReference));
  Case plain = c.fresh_copy();
  if (cfg.dtype == DType::kFloat32) {
    plain_backward_tf32(plain);
  } else {
    plain_backward(plain);
  }

  const bool softmax = cfg.score == ScoreFunction::kSoftmax;
  if (fwd == ForwardOn::kCpu && softmax) {
    ASSERT_TRUE(run_forward(c, Backend::kCpu));
  }
  DeviceCase dc(c, backend, DeviceCase::Pass::kBackward);
  if (fwd == ForwardOn::kGpu && softmax) {
    const Status s = attention_forward(dc.forward_args());
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download_forward();
  }
  const Status s = attention_backward(dc.backward_args(deterministic));
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.download_gradients();

  const double factor = softmax ? kGradFactor : kHstuFactor;
  EXPECT_TRUE(check_close("dq", c.dq, plain.dq, ref.dq, factor));
  EXPECT_TRUE(check_close("dk", c.dk, plain.dk, ref.dk, factor, cfg.dk_atol));
  EXPECT_TRUE(check_close("dv", c.dv, plain.dv, ref.dv, factor));
  if (cfg.drab) {
    EXPECT_TRUE(check_close("drab", c.drab, plain.drab, ref.drab, kHstuFactor));
  }

  const HostTensor* grads[] = {&c.dq, &c.dk, &c.dv, &c.drab};
  const char* names[] = {"dq", "dk", "dv", "drab"};
  std::vector<std::vector<unsigned char>> first;
  for (const HostTensor* g : grads) first.push_back(g->bytes);
  for (int run = 1; run <= repeats; ++run) {
    dc.poison_gradients();
    const Status again = attention_backward(dc.backward_args(deterministic));
    ASSERT_TRUE(again.ok()) << again.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download_gradients();
    for (size_t i = 0; i < first.size(); ++i) {
      ASSERT_TRUE(first[i] == grads[i]->bytes) << names[i] << " of run " << run << " differs from run 0";
    }
  }
}

bool is_hopper() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major == 9;
}

}  // namespace cuteattn::test
