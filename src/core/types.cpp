// Small helpers of the public types: tensor views and names.
#include "cuteattn/types.h"

namespace cuteattn {

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
    case DType::kInt32: return "int32";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
  }
  return 0;
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kCpuReference: return "cpu-reference";
    case Backend::kCpu: return "cpu";
    case Backend::kSm80: return "sm80";
    case Backend::kSm90: return "sm90";
  }
  return "unknown";
}

}  // namespace cuteattn
