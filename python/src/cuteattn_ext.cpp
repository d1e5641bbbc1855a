// The nanobind module `cuteattn._cuteattn`: turns DLPack arrays (CPU or CUDA, from any framework; torch is
// never linked) into cuteattn::Tensor views and calls the C++ API. Outputs are allocated by the caller, and so is
// scratch when the caller passes a workspace or an `allocate` callback, so a framework's caching allocator and
// CUDA graph capture keep working.
//
// Errors: StatusCode::kInvalidArgument -> ValueError, kNotSupported -> NotImplementedError (a subclass of
// RuntimeError in Python), every other failure -> RuntimeError; the message is the library's.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "cuteattn/cuteattn.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Array = nb::ndarray<>;

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

void raise_if_failed(const cuteattn::Status& status) {
  switch (status.code) {
    case cuteattn::StatusCode::kOk: return;
    case cuteattn::StatusCode::kInvalidArgument: raise(PyExc_ValueError, status.message);
    case cuteattn::StatusCode::kNotSupported: raise(PyExc_NotImplementedError, status.message);
    default: raise(PyExc_RuntimeError, status.message);
  }
}

cuteattn::DType to_dtype(const nb::dlpack::dtype& dt, const char* name) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (dt.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 16) return cuteattn::DType::kFloat16;
    if (code == nb::dlpack::dtype_code::Bfloat && dt.bits == 16) return cuteattn::DType::kBFloat16;
    if (code == nb::dlpack::dtype_code::Float && dt.bits == 32) return cuteattn::DType::kFloat32;
    if (code == nb::dlpack::dtype_code::Int && dt.bits == 32) return cuteattn::DType::kInt32;
  }
  raise(PyExc_ValueError, std::string(name) + ": unsupported dtype (DLPack code " + std::to_string(dt.code) +
                              ", " + std::to_string(dt.bits) + " bits); expected float16, bfloat16, float32 or int32");
}

// Which device every array of one call must live on; set by the first array seen (q).
struct DeviceOf {
  bool known = false;
  int type = 0;
  int index = 0;
  std::string first;

  static std::string describe(int type, int index) {
    if (type == nb::device::cpu::value) return "cpu";
    if (type == nb::device::cuda::value) return "cuda:" + std::to_string(index);
    return "DLPack device " + std::to_string(type) + ":" + std::to_string(index);
  }

  void check(const Array& a, const char* name) {
    const int type_a = a.device_type();
    const int index_a = type_a == nb::device::cpu::value ? 0 : a.device_id();
    if (type_a != nb::device::cpu::value && type_a != nb::device::cuda::value)
      raise(PyExc_ValueError, std::string(name) + ": tensors must live on the CPU or a CUDA device, not " +
                                  describe(type_a, index_a));
    if (!known) {
      known = true, type = type_a, index = index_a, first = name;
      return;
    }
    if (type_a != type || index_a != index)
      raise(PyExc_ValueError, std::string(name) + ": on " + describe(type_a, index_a) + " but " + first + " is on " +
                                  describe(type, index));
  }
};

// A view of `a`, or an absent tensor when `a` is None.
cuteattn::Tensor view(const Array& a, const char* name, DeviceOf& device) {
  cuteattn::Tensor t;
  if (!a.is_valid()) return t;
  device.check(a, name);
  if (a.ndim() < 1 || a.ndim() > static_cast<size_t>(cuteattn::Tensor::kMaxRank))
    raise(PyExc_ValueError, std::string(name) + ": rank " + std::to_string(a.ndim()) + " is not in [1, " +
                                std::to_string(cuteattn::Tensor::kMaxRank) + "]");
  t.data = a.data();
  t.dtype = to_dtype(a.dtype(), name);
  t.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = static_cast<int64_t>(a.shape(i));
    t.stride[i] = a.stride(i);
  }
  return t;
}

cuteattn::Backend to_backend(const std::string& name) {
  if (name == "auto") return cuteattn::Backend::kAuto;
  if (name == "ref") return cuteattn::Backend::kCpuReference;
  if (name == "cpu") return cuteattn::Backend::kCpu;
  if (name == "sm80") return cuteattn::Backend::kSm80;
  if (name == "sm90") return cuteattn::Backend::kSm90;
  raise(PyExc_ValueError, "backend: '" + name + "' is not one of auto, ref, cpu, sm80, sm90");
}

const char* backend_str(cuteattn::Backend backend) {
  switch (backend) {
    case cuteattn::Backend::kCpuReference: return "ref";
    case cuteattn::Backend::kCpu: return "cpu";
    case cuteattn::Backend::kSm80: return "sm80";
    case cuteattn::Backend::kSm90: return "sm90";
    default: return "auto";
  }
}

cuteattn::ScoreFunction to_score(const std::string& name) {
  if (name == "softmax") return cuteattn::ScoreFunction::kSoftmax;
  if (name == "hstu") return cuteattn::ScoreFunction::kHstuSilu;
  raise(PyExc_ValueError, "score: '" + name + "' is not one of softmax, hstu");
}

// One attention problem as the Python side describes it. Holds its arrays so their memory outlives the
// views in `problem`; every later array of the call (outputs, gradients) must share its device.
struct ProblemHolder {
  cuteattn::Problem problem;
  DeviceOf device;
  std::vector<Array> keep;

  cuteattn::Tensor add(const Array& a, const char* name) {
    cuteattn::Tensor t = view(a, name, device);
    if (a.is_valid()) keep.push_back(a);
    return t;
  }
};

void init_problem(ProblemHolder* self, const std::string& score, Array q, Array k, Array v, Array cu_seqlens_q,
                  Array cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal, int64_t window_left,
                  int64_t window_right, double softmax_scale, double softcap, double alpha, double scaling_seqlen,
                  Array rab, Array num_contexts, Array num_targets, int64_t target_group_size,
                  const std::string& backend, uintptr_t stream, int num_threads) {
  ProblemHolder h;  // built aside, so a refused argument leaves `self` unconstructed
  cuteattn::Problem& p = h.problem;
  p.score = to_score(score);
  p.backend = to_backend(backend);
  p.q = h.add(q, "q");
  p.k = h.add(k, "k");
  p.v = h.add(v, "v");
  p.cu_seqlens_q = h.add(cu_seqlens_q, "cu_seqlens_q");
  p.cu_seqlens_k = h.add(cu_seqlens_k, "cu_seqlens_k");
  p.rab = h.add(rab, "rab");
  p.num_contexts = h.add(num_contexts, "num_contexts");
  p.num_targets = h.add(num_targets, "num_targets");
  p.max_seqlen_q = max_seqlen_q;
  p.max_seqlen_k = max_seqlen_k;
  p.causal = causal;
  p.window_left = window_left;
  p.window_right = window_right;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.alpha = static_cast<float>(alpha);
  p.scaling_seqlen = static_cast<float>(scaling_seqlen);
  p.target_group_size = target_group_size;
  p.device = h.device.type == nb::device::cuda::value ? cuteattn::DeviceKind::kCuda : cuteattn::DeviceKind::kCpu;
  p.device_index = h.device.index;
  p.stream = reinterpret_cast<void*>(stream);
  p.num_threads = num_threads;
  new (self) ProblemHolder(std::move(h));
}

cuteattn::ForwardArgs forward_args(ProblemHolder& h, const Array& out, const Array& lse) {
  cuteattn::ForwardArgs args;
  args.problem = h.problem;
  args.out = view(out, "out", h.device);
  args.lse = view(lse, "lse", h.device);
  return args;
}

// The call's scratch: `workspace` when given, else, when `allocate` is given and the call needs scratch,
// allocate(bytes) (a DLPack array on the call's device, kept alive in `workspace` until the call returns). With
// neither, the library provides it (a forward: its per-stream buffer; a backward: a stream-ordered allocation).
template <class Args>
void provide_workspace(Args& args, DeviceOf& device, Array& workspace, const nb::object& allocate,
                       size_t (*bytes_needed)(const Args&)) {
  if (!workspace.is_valid() && !allocate.is_none()) {
    const size_t bytes = bytes_needed(args);
    if (bytes > 0) workspace = nb::cast<Array>(allocate(bytes));
  }
  if (!workspace.is_valid()) return;
  device.check(workspace, "workspace");
  args.workspace = workspace.data();
  args.workspace_bytes = workspace.nbytes();
}

// No argument check of its own (0 for arguments the call will refuse): forward checks them once.
size_t forward_workspace_bytes(ProblemHolder& h, Array out, Array lse) {
  return cuteattn::forward_workspace_bytes(forward_args(h, out, lse));
}

void forward(ProblemHolder& h, Array out, Array lse, Array workspace, nb::object allocate) {
  cuteattn::ForwardArgs args = forward_args(h, out, lse);
  provide_workspace(args, h.device, workspace, allocate, &cuteattn::forward_workspace_bytes);
  cuteattn::Status status;
  {
    nb::gil_scoped_release release;
    status = cuteattn::attention_forward(args);
  }
  raise_if_failed(status);
}

cuteattn::BackwardArgs backward_args(ProblemHolder& h, const Array& out, const Array& lse, const Array& dout,
                                     const Array& dq, const Array& dk, const Array& dv, const Array& drab,
                                     bool deterministic) {
  cuteattn::BackwardArgs args;
  args.problem = h.problem;
  args.out = view(out, "out", h.device);
  args.lse = view(lse, "lse", h.device);
  args.dout = view(dout, "dout", h.device);
  args.dq = view(dq, "dq", h.device);
  args.dk = view(dk, "dk", h.device);
  args.dv = view(dv, "dv", h.device);
  args.drab = view(drab, "drab", h.device);
  args.deterministic = deterministic;
  return args;
}

size_t workspace_bytes(ProblemHolder& h, Array out, Array lse, Array dout, Array dq, Array dk, Array dv, Array drab,
                       bool deterministic) {
  cuteattn::BackwardArgs args = backward_args(h, out, lse, dout, dq, dk, dv, drab, deterministic);
  raise_if_failed(cuteattn::check_backward(args));
  return cuteattn::backward_workspace_bytes(args);
}

void backward(ProblemHolder& h, Array out, Array lse, Array dout, Array dq, Array dk, Array dv, Array drab,
              bool deterministic, Array workspace, nb::object allocate) {
  cuteattn::BackwardArgs args = backward_args(h, out, lse, dout, dq, dk, dv, drab, deterministic);
  provide_workspace(args, h.device, workspace, allocate, &cuteattn::backward_workspace_bytes);
  cuteattn::Status status;
  {
    nb::gil_scoped_release release;
    status = cuteattn::attention_backward(args);
  }
  raise_if_failed(status);
}

std::string resolve_forward(ProblemHolder& h, Array out, Array lse) {
  cuteattn::ForwardArgs args = forward_args(h, out, lse);
  cuteattn::Backend chosen = cuteattn::Backend::kAuto;
  raise_if_failed(cuteattn::resolve_backend(args, &chosen));
  return backend_str(chosen);
}

}  // namespace

NB_MODULE(_cuteattn, m) {
  m.doc() = "cuteattn C++ library binding (DLPack arrays in, caller-allocated outputs)";

  nb::class_<ProblemHolder>(m, "Problem",
                            "One attention problem: inputs, layout, score function, mask and execution options.")
      .def("__init__", &init_problem, "score"_a, "q"_a, "k"_a, "v"_a, nb::kw_only(),
           "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
           "max_seqlen_k"_a = 0, "causal"_a = false, "window_left"_a = -1, "window_right"_a = -1,
           "softmax_scale"_a = 0.0, "softcap"_a = 0.0, "alpha"_a = 1.0, "scaling_seqlen"_a = 0.0,
           "rab"_a.none() = nb::none(), "num_contexts"_a.none() = nb::none(), "num_targets"_a.none() = nb::none(),
           "target_group_size"_a = 1, "backend"_a = "auto", "stream"_a = 0, "num_threads"_a = 0);

  m.def("forward_workspace_bytes", &forward_workspace_bytes, "problem"_a, "out"_a, "lse"_a.none() = nb::none(),
        "The bytes of device scratch attention_forward needs (0 on the CPU and for arguments it refuses).");
  m.def("forward", &forward, "problem"_a, "out"_a, "lse"_a.none() = nb::none(), "workspace"_a.none() = nb::none(),
        "allocate"_a.none() = nb::none(),
        "Run the forward pass into the caller's `out` (and `lse` for softmax). Scratch: `workspace`, else "
        "`allocate(nbytes)` (returning a DLPack array on the call's device) when the call needs some, else the "
        "library's per-stream buffer.");
  m.def("resolve_forward_backend", &resolve_forward, "problem"_a, "out"_a, "lse"_a.none() = nb::none(),
        "Checks the forward arguments and names the backend the call would run on (ref, cpu, sm80, sm90).");
  m.def("backward_workspace_bytes", &workspace_bytes, "problem"_a, "out"_a.none(), "lse"_a.none(), "dout"_a, "dq"_a,
        "dk"_a, "dv"_a, "drab"_a.none() = nb::none(), "deterministic"_a = false,
        "Checks the backward arguments and returns the bytes of device scratch attention_backward needs.");
  m.def("backward", &backward, "problem"_a, "out"_a.none(), "lse"_a.none(), "dout"_a, "dq"_a, "dk"_a, "dv"_a,
        "drab"_a.none() = nb::none(), "deterministic"_a = false, "workspace"_a.none() = nb::none(),
        "allocate"_a.none() = nb::none(),
        "Run the backward pass into the caller's gradients. Scratch: `workspace`, else `allocate(nbytes)` "
        "(returning a DLPack array on the call's device), else a stream-ordered allocation of the library's.");

  m.def("version", &cuteattn::version);
  m.def("compiled_archs", &cuteattn::compiled_archs);
  m.def("cuda_available", &cuteattn::cuda_available);
}
