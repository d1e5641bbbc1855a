// cuteattn-cli problem setup: the problem after defaults (sequence lengths drawn), its random inputs, and the
// host or device buffers that hold one call's tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli_flags.h"
#include "cuteattn/attention.h"

namespace cuteattn::cli {

// A concrete problem: every default resolved, every length drawn.
struct ProblemSpec {
  bool gpu = false;  // tensors live on the GPU
  Backend backend = Backend::kAuto;
  int64_t b = 0, max_q = 0, max_k = 0, h = 0, hk = 0, d = 0, dv = 0;
  DType dtype = DType::kFloat32;
  ScoreFunction score = ScoreFunction::kSoftmax;
  bool varlen = false;  // jagged layout (--varlen, and always for HSTU)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  float alpha = 1.0f;
  int64_t rab_heads = 0;  // 0: no rab
  int64_t rab_ld = 0;     // row stride of the rab storage, padded to 16 bytes for GPU vector loads
  int64_t group_size = 1;
  bool has_contexts = false, has_targets = false;
  bool deterministic = false;
  Direction direction = Direction::kBoth;
  int iters = 1;
  uint64_t seed = 0;
  int64_t check_rows = -1;

  std::vector<int32_t> cu_q, cu_k;         // b+1 row offsets (fixed layout: multiples of the lengths)
  std::vector<int32_t> contexts, targets;  // b entries when has_contexts / has_targets

  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
  int64_t len_q(int64_t bi) const { return cu_q[bi + 1] - cu_q[bi]; }
  int64_t len_k(int64_t bi) const { return cu_k[bi + 1] - cu_k[bi]; }
  bool softmax() const { return score == ScoreFunction::kSoftmax; }
  int64_t lse_index(int64_t bi, int64_t head, int64_t row) const {
    return varlen ? head * total_q() + cu_q[bi] + row : (bi * h + head) * max_q + row;
  }
  int64_t rab_index(int64_t bi, int64_t head, int64_t r, int64_t j) const {
    return ((bi * rab_heads + head) * max_k + r) * rab_ld + j;
  }
  int64_t rab_elements() const { return b * rab_heads * max_k * rab_ld; }
};

// Resolves defaults and draws lengths; on failure (a flag the device cannot honour) returns false and *error.
bool make_spec(const CliOptions& options, bool cuda_present, ProblemSpec* spec, std::string* error);

// The random inputs: each element is a standard normal drawn from (seed, input, storage index), so any slice
// can be regenerated for the oracle without keeping a copy.
enum class Input : uint64_t { kQ = 1, kK = 2, kV = 3, kRab = 4, kDout = 5 };
float input_value(uint64_t seed, Input input, int64_t index, DType dtype);  // rounded to dtype

// Bytes in host or device memory. Failures throw std::runtime_error.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, bool device);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  void poison();  // all bytes 0xff: NaN in fp16, bf16 and fp32
  void upload(const void* host, size_t bytes, size_t offset);
  std::vector<unsigned char> download() const;

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool device_ = false;
};

// The tensors of one problem. Inputs are filled on construction; outputs are poisoned before each checked run.
struct ProblemTensors {
  Buffer q, k, v, rab, dout, cu_q, cu_k, contexts, targets;
  Buffer out, lse, dq, dk, dv, drab;

  explicit ProblemTensors(const ProblemSpec& spec);
  ForwardArgs forward_args(const ProblemSpec& spec) const;
  BackwardArgs backward_args(const ProblemSpec& spec) const;
};

}  // namespace cuteattn::cli
