// cuteattn-cli problem setup: defaults, drawn lengths, counter-based random inputs and host/device buffers.
#include "problem_setup.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <thread>

#include "cpu/element_cpu.h"

#if CUTEATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cuteattn::cli {
namespace {

#if CUTEATTN_WITH_CUDA
void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}
#endif

uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Runs body(begin, end) over [0, n) on all hardware threads.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  const int64_t threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (n < (int64_t{1} << 16) || threads == 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t step = (n + threads - 1) / threads;
  for (int64_t begin = 0; begin < n; begin += step) pool.emplace_back(body, begin, std::min(n, begin + step));
  for (std::thread& t : pool) t.join();
}

// Writes input values [first, first + count) in dtype into `dst`.
void generate(void* dst, DType dtype, uint64_t seed, Input input, int64_t first, int64_t count) {
  parallel_for(count, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      detail::cpu::store_element(dst, dtype, i, input_value(seed, input, first + i, dtype));
  });
}

Buffer random_buffer(bool device, DType dtype, uint64_t seed, Input input, int64_t count) {
  const size_t elem = dtype_size(dtype);
  Buffer buf(static_cast<size_t>(count) * elem, device);
  if (!device) {
    generate(buf.data(), dtype, seed, input, 0, count);
    return buf;
  }
  const int64_t chunk = int64_t{1} << 24;
  std::vector<unsigned char> staging(static_cast<size_t>(std::min(count, chunk)) * elem);
  for (int64_t first = 0; first < count; first += chunk) {
    const int64_t n = std::min(chunk, count - first);
    generate(staging.data(), dtype, seed, input, first, n);
    buf.upload(staging.data(), static_cast<size_t>(n) * elem, static_cast<size_t>(first) * elem);
  }
  return buf;
}

Buffer int_buffer(bool device, const std::vector<int32_t>& values) {
  Buffer buf(values.size() * sizeof(int32_t), device);
  buf.upload(values.data(), values.size() * sizeof(int32_t), 0);
  return buf;
}

std::vector<int32_t> draw_lengths(int64_t b, int64_t max_len, bool jagged, std::mt19937_64& rng) {
  std::vector<int32_t> lengths(static_cast<size_t>(b), static_cast<int32_t>(max_len));
  if (jagged) {
    std::uniform_int_distribution<int64_t> dist(static_cast<int64_t>(std::ceil(0.9 * static_cast<double>(max_len))),
                                                max_len);
    for (int32_t& len : lengths) len = static_cast<int32_t>(dist(rng));
  }
  return lengths;
}

std::vector<int32_t> offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) cu[i + 1] = cu[i] + lengths[i];
  return cu;
}

}  // namespace

bool make_spec(const CliOptions& o, bool cuda_present, ProblemSpec* spec, std::string* error) {
  ProblemSpec s;
  const bool gpu_backend = o.backend == BackendChoice::kSm80 || o.backend == BackendChoice::kSm90;
  if (gpu_backend && !cuda_present) {
    *error = std::string("--backend ") + (o.backend == BackendChoice::kSm80 ? "sm80" : "sm90") +
             ": no CUDA GPU (this build has CUDA: " + (CUTEATTN_WITH_CUDA ? "yes" : "no") + ")";
    return false;
  }
  s.gpu = gpu_backend || (o.backend == BackendChoice::kAuto && cuda_present);
  switch (o.backend) {
    case BackendChoice::kAuto:
      s.backend = Backend::kAuto;
      break;
    case BackendChoice::kCpu:
      s.backend = Backend::kCpu;
      break;
    case BackendChoice::kReference:
      s.backend = Backend::kCpuReference;
      break;
    case BackendChoice::kSm80:
      s.backend = Backend::kSm80;
      break;
    case BackendChoice::kSm90:
      s.backend = Backend::kSm90;
      break;
  }
  s.b = o.batch.value_or(s.gpu ? 4 : 2);
  s.max_q = o.seqlen_q.value_or(s.gpu ? 2048 : 256);
  s.max_k = o.seqlen_k.value_or(s.max_q);
  s.h = o.heads.value_or(s.gpu ? 16 : 4);
  s.hk = o.heads_k.value_or(s.h);
  s.d = o.head_dim.value_or(s.gpu ? 128 : 64);
  s.dv = o.head_dim_v.value_or(s.d);
  s.dtype = o.dtype.value_or(s.gpu ? DType::kBFloat16 : DType::kFloat32);
  s.score = o.score;
  s.varlen = o.varlen || o.score == ScoreFunction::kHstuSilu;
  s.causal = o.causal || o.demo;
  s.window_left = o.window_left;
  s.window_right = o.window_right;
  s.softcap = o.softcap;
  s.alpha = o.alpha.value_or(o.score == ScoreFunction::kHstuSilu ? 1.0f / static_cast<float>(s.d) : 1.0f);
  s.rab_heads = o.rab == RabMode::kNone ? 0 : o.rab == RabMode::kShared ? 1 : s.h;
  const int64_t align = 16 / static_cast<int64_t>(dtype_size(s.dtype));
  s.rab_ld = (s.max_k + align - 1) / align * align;
  s.group_size = o.group_size;
  s.has_contexts = o.contexts > 0;
  s.has_targets = o.targets > 0;
  s.deterministic = o.deterministic;
  s.direction = o.direction;
  s.iters = static_cast<int>(o.iters.value_or(s.gpu ? 20 : 3));
  s.seed = o.seed;
  s.check_rows = o.check_rows;

  int64_t rows = 0;
  if (__builtin_mul_overflow(s.b, std::max(s.max_q, s.max_k), &rows) || rows > INT32_MAX) {
    *error = "--batch x --seqlen: too many rows for the int32 sequence offsets";
    return false;
  }
  std::mt19937_64 rng(s.seed);
  const std::vector<int32_t> len_q = draw_lengths(s.b, s.max_q, o.varlen, rng);
  const std::vector<int32_t> len_k = s.max_k == s.max_q ? len_q : draw_lengths(s.b, s.max_k, o.varlen, rng);
  s.cu_q = offsets(len_q);
  s.cu_k = offsets(len_k);
  for (int64_t bi = 0; bi < s.b; ++bi) {
    const int64_t n_t = std::min<int64_t>(o.targets, len_k[bi]);
    if (s.has_targets) s.targets.push_back(static_cast<int32_t>(n_t));
    if (s.has_contexts) s.contexts.push_back(static_cast<int32_t>(std::min<int64_t>(o.contexts, len_k[bi] - n_t)));
  }
  *spec = s;
  return true;
}

float input_value(uint64_t seed, Input input, int64_t index, DType dtype) {
  const uint64_t a = mix64(mix64(seed ^ (static_cast<uint64_t>(input) << 56)) ^ static_cast<uint64_t>(index));
  const uint64_t b = mix64(a);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return detail::cpu::round_to(dtype, static_cast<float>(normal));
}

// ---- Buffer ----

Buffer::Buffer(size_t bytes, bool device) : bytes_(bytes), device_(device) {
  const size_t alloc = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  if (!device) {
    data_ = std::aligned_alloc(64, alloc);
    if (!data_) throw std::runtime_error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    return;
  }
#if CUTEATTN_WITH_CUDA
  cuda_check(cudaMalloc(&data_, alloc), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
#else
  throw std::runtime_error("device buffers need a CUDA build");
#endif
}

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (!data_) return;
  if (!device_) std::free(data_);
#if CUTEATTN_WITH_CUDA
  if (device_) cudaFree(data_);
#endif
  data_ = nullptr;
}

void Buffer::poison() {
  if (!data_) return;
  if (!device_) {
    std::memset(data_, 0xff, bytes_);
    return;
  }
#if CUTEATTN_WITH_CUDA
  cuda_check(cudaMemset(data_, 0xff, bytes_), "cudaMemset");
#endif
}

void Buffer::upload(const void* host, size_t bytes, size_t offset) {
  if (bytes == 0) return;
  if (!device_) {
    std::memcpy(static_cast<char*>(data_) + offset, host, bytes);
    return;
  }
#if CUTEATTN_WITH_CUDA
  cuda_check(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
}

std::vector<unsigned char> Buffer::download() const {
  std::vector<unsigned char> host(bytes_);
  if (bytes_ == 0) return host;
  if (!device_) {
    std::memcpy(host.data(), data_, bytes_);
    return host;
  }
#if CUTEATTN_WITH_CUDA
  cuda_check(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
  return host;
}

// ---- ProblemTensors ----

ProblemTensors::ProblemTensors(const ProblemSpec& s) {
  const bool dev = s.gpu;
  const size_t elem = dtype_size(s.dtype);
  const int64_t tq = s.total_q(), tk = s.total_k();
  const bool backward = s.direction != Direction::kForward;
  q = random_buffer(dev, s.dtype, s.seed, Input::kQ, tq * s.h * s.d);
  k = random_buffer(dev, s.dtype, s.seed, Input::kK, tk * s.hk * s.d);
  v = random_buffer(dev, s.dtype, s.seed, Input::kV, tk * s.hk * s.dv);
  if (s.rab_heads > 0) rab = random_buffer(dev, s.dtype, s.seed, Input::kRab, s.rab_elements());
  if (backward) dout = random_buffer(dev, s.dtype, s.seed, Input::kDout, tq * s.h * s.dv);
  if (s.varlen) {
    cu_q = int_buffer(dev, s.cu_q);
    cu_k = int_buffer(dev, s.cu_k);
  }
  if (s.has_contexts) contexts = int_buffer(dev, s.contexts);
  if (s.has_targets) targets = int_buffer(dev, s.targets);
  out = Buffer(static_cast<size_t>(tq * s.h * s.dv) * elem, dev);
  if (s.softmax()) lse = Buffer(static_cast<size_t>(tq * s.h) * sizeof(float), dev);
  if (backward) {
    dq = Buffer(static_cast<size_t>(tq * s.h * s.d) * elem, dev);
    dk = Buffer(static_cast<size_t>(tk * s.hk * s.d) * elem, dev);
    dv = Buffer(static_cast<size_t>(tk * s.hk * s.dv) * elem, dev);
    if (s.rab_heads > 0) drab = Buffer(static_cast<size_t>(s.rab_elements()) * elem, dev);
  }
}

namespace {

Tensor rows_tensor(const Buffer& buf, const ProblemSpec& s, int64_t rows_per_seq, int64_t total, int64_t heads,
                   int64_t dim) {
  if (s.varlen) return make_tensor(buf.data(), s.dtype, {total, heads, dim});
  return make_tensor(buf.data(), s.dtype, {s.b, rows_per_seq, heads, dim});
}

Tensor rab_tensor(const Buffer& buf, const ProblemSpec& s) {
  Tensor t = make_tensor(buf.data(), s.dtype, {s.b, s.rab_heads, s.max_k, s.max_k});
  t.stride[2] = s.rab_ld;
  t.stride[1] = s.max_k * s.rab_ld;
  t.stride[0] = s.rab_heads * t.stride[1];
  return t;
}

Problem problem_of(const ProblemTensors& t, const ProblemSpec& s) {
  Problem p;
  p.score = s.score;
  p.q = rows_tensor(t.q, s, s.max_q, s.total_q(), s.h, s.d);
  p.k = rows_tensor(t.k, s, s.max_k, s.total_k(), s.hk, s.d);
  p.v = rows_tensor(t.v, s, s.max_k, s.total_k(), s.hk, s.dv);
  if (s.varlen) {
    p.cu_seqlens_q = make_tensor(t.cu_q.data(), DType::kInt32, {s.b + 1});
    p.cu_seqlens_k = make_tensor(t.cu_k.data(), DType::kInt32, {s.b + 1});
    p.max_seqlen_q = s.max_q;
    p.max_seqlen_k = s.max_k;
  }
  p.causal = s.causal;
  p.window_left = s.window_left;
  p.window_right = s.window_right;
  p.softcap = s.softcap;
  p.alpha = s.alpha;
  if (s.rab_heads > 0) p.rab = rab_tensor(t.rab, s);
  if (s.has_contexts) p.num_contexts = make_tensor(t.contexts.data(), DType::kInt32, {s.b});
  if (s.has_targets) p.num_targets = make_tensor(t.targets.data(), DType::kInt32, {s.b});
  p.target_group_size = s.group_size;
  p.backend = s.backend;
  p.device = s.gpu ? DeviceKind::kCuda : DeviceKind::kCpu;
  return p;
}

}  // namespace

ForwardArgs ProblemTensors::forward_args(const ProblemSpec& s) const {
  ForwardArgs a;
  a.problem = problem_of(*this, s);
  a.out = rows_tensor(out, s, s.max_q, s.total_q(), s.h, s.dv);
  if (s.softmax()) {
    a.lse = s.varlen ? make_tensor(lse.data(), DType::kFloat32, {s.h, s.total_q()})
                     : make_tensor(lse.data(), DType::kFloat32, {s.b, s.h, s.max_q});
  }
  return a;
}

BackwardArgs ProblemTensors::backward_args(const ProblemSpec& s) const {
  const ForwardArgs f = forward_args(s);
  BackwardArgs a;
  a.problem = f.problem;
  if (s.softmax()) {
    a.out = f.out;
    a.lse = f.lse;
  }
  a.dout = rows_tensor(dout, s, s.max_q, s.total_q(), s.h, s.dv);
  a.dq = rows_tensor(dq, s, s.max_q, s.total_q(), s.h, s.d);
  a.dk = rows_tensor(dk, s, s.max_k, s.total_k(), s.hk, s.d);
  a.dv = rows_tensor(dv, s, s.max_k, s.total_k(), s.hk, s.dv);
  if (s.rab_heads > 0) a.drab = rab_tensor(drab, s);
  a.deterministic = s.deterministic;
  return a;
}

}  // namespace cuteattn::cli
