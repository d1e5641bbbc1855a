// cuteattn public types: element types, devices, backends, status codes and the strided tensor view.
// Plain C++17; no CUTLASS, CUDA or framework types appear in the public headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace cuteattn {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kInt32 = 3 };

// Where the tensors of one call live. All tensors of a call live on the same device.
enum class DeviceKind : int { kCpu = 0, kCuda = 1 };

// Which implementation runs a call. kAuto picks the fastest one present for the device:
// CPU tensors -> kCpu; CUDA tensors -> kSm90 on Hopper where a kernel exists for the problem, else kSm80.
enum class Backend : int { kAuto = 0, kCpuReference = 1, kCpu = 2, kSm80 = 3, kSm90 = 4 };

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // the call breaks SEMANTICS.md section 3; the message names the argument
  kNotSupported = 2,     // valid, but the chosen backend has no kernel for it (e.g. head dim not compiled)
  kCudaError = 3,        // a CUDA runtime call failed
  kInternal = 4,
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;  // "<argument>: <what is wrong>" for kInvalidArgument

  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
  static Status Invalid(const std::string& argument, const std::string& what) {
    return {StatusCode::kInvalidArgument, argument + ": " + what};
  }
  static Status NotSupported(const std::string& what) { return {StatusCode::kNotSupported, what}; }
};

// A strided view of up to 4 dimensions; strides are in elements, 64-bit.
// An optional argument is "absent" when rank == 0 (the default).
struct Tensor {
  static constexpr int kMaxRank = 4;
  void* data = nullptr;
  DType dtype = DType::kFloat16;
  int rank = 0;
  int64_t shape[kMaxRank] = {0, 0, 0, 0};
  int64_t stride[kMaxRank] = {0, 0, 0, 0};

  bool defined() const { return rank > 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
};

// A row-major (contiguous) view of `data` with the given shape.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape);

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);
const char* backend_name(Backend backend);

}  // namespace cuteattn
