// The public entry points: check the arguments, normalise them into Params, pick a backend, run it.
#include "core/check.h"
#include "core/gpu_dispatch.h"
#include "core/params.h"
#include "cpu/cpu_backend.h"
#include "cuteattn/attention.h"

namespace cuteattn {
namespace {

Status resolve(const detail::Params& params, const Problem& problem, bool backward, Backend* chosen) {
  if (problem.backend != Backend::kAuto) {
    *chosen = problem.backend;  // the checker has matched it with the device
    return Status::Ok();
  }
  if (problem.device == DeviceKind::kCpu) {
    *chosen = Backend::kCpu;
    return Status::Ok();
  }
  return detail::resolve_gpu_backend(params, backward, chosen);
}

}  // namespace

Status resolve_backend(const ForwardArgs& args, Backend* chosen) {
  Status s = check_forward(args);
  if (!s.ok()) return s;
  return resolve(detail::build_forward_params(args), args.problem, false, chosen);
}

Status resolve_backend(const BackwardArgs& args, Backend* chosen) {
  Status s = check_backward(args);
  if (!s.ok()) return s;
  return resolve(detail::build_backward_params(args), args.problem, true, chosen);
}

Status attention_forward(const ForwardArgs& args) {
  Status s = check_forward(args);
  if (!s.ok()) return s;
  const detail::Params params = detail::build_forward_params(args);
  Backend backend;
  s = resolve(params, args.problem, false, &backend);
  if (!s.ok()) return s;
  switch (backend) {
    case Backend::kCpuReference: return detail::cpu::reference_forward(params);
    case Backend::kCpu: return detail::cpu::tiled_forward(params);
    default: return detail::gpu_forward(params, backend, args.workspace, args.workspace_bytes);
  }
}

Status attention_backward(const BackwardArgs& args) {
  Status s = check_backward(args);
  if (!s.ok()) return s;
  const detail::Params params = detail::build_backward_params(args);
  Backend backend;
  s = resolve(params, args.problem, true, &backend);
  if (!s.ok()) return s;
  switch (backend) {
    case Backend::kCpuReference: return detail::cpu::reference_backward(params);
    case Backend::kCpu: return detail::cpu::tiled_backward(params);
    default: return detail::gpu_backward(params, backend, args.workspace, args.workspace_bytes);
  }
}

size_t forward_workspace_bytes(const ForwardArgs& args) {
  // Shapes only, as for the backward.
  if (args.problem.device != DeviceKind::kCuda || !detail::check_forward_arguments(args, false).ok()) return 0;
  const detail::Params params = detail::build_forward_params(args);
  Backend backend;
  if (!resolve(params, args.problem, false, &backend).ok()) return 0;
  return detail::gpu_workspace_bytes(params, backend, false);
}

size_t backward_workspace_bytes(const BackwardArgs& args) {
  // The size depends on shapes only: the device-data checks (a host copy and a sync) run once, in the call itself.
  if (args.problem.device != DeviceKind::kCuda || !detail::check_backward_arguments(args, false).ok()) return 0;
  const detail::Params params = detail::build_backward_params(args);
  Backend backend;
  if (!resolve(params, args.problem, true, &backend).ok()) return 0;
  return detail::gpu_workspace_bytes(params, backend, true);
}

}  // namespace cuteattn
