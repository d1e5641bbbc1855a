// cuteattn-cli run and report: checked run, timed runs (median), TFLOP/s and the oracle comparison.
#include "run_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuteattn/version.h"
#include "oracle_check.h"

#if CUTEATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cuteattn::cli {
namespace {

// Key/query pairs a sequence computes: the convention halves causal; windows count their visible pairs.
double visible_pairs(const ProblemSpec& s, int64_t sq, int64_t sk) {
  const int64_t right = s.causal ? 0 : s.window_right;
  if (s.window_left < 0 && right < 0) return static_cast<double>(sq) * static_cast<double>(sk);
  if (s.window_left < 0 && s.causal) return 0.5 * static_cast<double>(sq) * static_cast<double>(sk);
  double pairs = 0.0;
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t r = i + sk - sq;
    const int64_t lo = s.window_left >= 0 ? std::max<int64_t>(0, r - s.window_left) : 0;
    const int64_t hi = right >= 0 ? std::min<int64_t>(sk - 1, r + right) : sk - 1;
    pairs += static_cast<double>(std::max<int64_t>(0, hi - lo + 1));
  }
  return pairs;
}

// The process exit code for a failed library call, with its one-line message.
int fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "cuteattn-cli: %s: %s\n", what.c_str(), s.message.c_str());
  return s.code == StatusCode::kInvalidArgument || s.code == StatusCode::kNotSupported ? 2 : 1;
}

Status device_sync(const ProblemSpec& s) {
#if CUTEATTN_WITH_CUDA
  if (s.gpu) {
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) return {StatusCode::kCudaError, cudaGetErrorString(err)};
  }
#endif
  (void)s;
  return Status::Ok();
}

// Runs `call` `iters` times; returns the median in milliseconds. GPU runs are timed with a pair of events
// each, enqueued back to back, so the host does not wait between runs.
double median_ms(const ProblemSpec& s, int iters, const std::function<Status()>& call, Status* status) {
  std::vector<double> ms;
#if CUTEATTN_WITH_CUDA
  if (s.gpu) {
    std::vector<cudaEvent_t> events(2 * static_cast<size_t>(iters));
    for (cudaEvent_t& e : events) cudaEventCreate(&e);
    for (int i = 0; i < iters && status->ok(); ++i) {
      cudaEventRecord(events[2 * i], nullptr);
      *status = call();
      cudaEventRecord(events[2 * i + 1], nullptr);
    }
    if (status->ok()) *status = device_sync(s);
    for (int i = 0; i < iters && status->ok(); ++i) {
      float elapsed = 0.0f;
      cudaEventElapsedTime(&elapsed, events[2 * i], events[2 * i + 1]);
      ms.push_back(elapsed);
    }
    for (cudaEvent_t& e : events) cudaEventDestroy(e);
  }
#endif
  for (int i = 0; i < iters && !s.gpu && status->ok(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    *status = call();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (!status->ok()) return 0.0;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::string number(float v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(v));
  return text;
}

std::string describe(const ProblemSpec& s) {
  std::string t = std::string(s.softmax() ? "softmax" : "hstu") + " " + dtype_name(s.dtype);
  if (s.causal) t += " causal";
  if (s.window_left >= 0 || s.window_right >= 0)
    t += " window(" + std::to_string(s.window_left) + "," + std::to_string(s.window_right) + ")";
  if (s.softcap > 0.0f) t += " softcap=" + number(s.softcap);
  if (!s.softmax()) t += " alpha=" + number(s.alpha);
  if (s.rab_heads > 0) t += " rab(h=" + std::to_string(s.rab_heads) + ")";
  if (s.has_contexts) t += " contexts";
  if (s.has_targets) t += " targets(group " + std::to_string(s.group_size) + ")";
  t += s.varlen ? " jagged" : " fixed";
  t += " b=" + std::to_string(s.b) + " s_q" + (s.varlen ? "<=" : "=") + std::to_string(s.max_q) + " s_k" +
       (s.varlen ? "<=" : "=") + std::to_string(s.max_k) + " h=" + std::to_string(s.h) +
       " h_k=" + std::to_string(s.hk) + " d=" + std::to_string(s.d) + " d_v=" + std::to_string(s.dv);
  return t;
}

// Prints the check of one direction; returns whether it passed (or did not run).
bool report_check(const CheckResult& c) {
  if (!c.ran) {
    std::printf("  check     skipped (--check-rows 0)\n");
    return true;
  }
  if (!c.error.empty()) {
    std::printf("  check     FAILED: %s\n", c.error.c_str());
    return false;
  }
  std::printf("  check     %s  vs float64 oracle on %s\n", c.passed() ? "ok" : "FAILED", c.scope.c_str());
  for (const ErrorStat& e : c.stats) {
    const double rel = e.max_ref > 0.0 ? e.max_err / e.max_ref : e.max_err;
    std::printf("    %-5s max err %.3e  max |ref| %.3e  rel %.3e (tol %.1e)", e.name.c_str(), e.max_err, e.max_ref, rel,
                e.tolerance);
    if (e.not_finite > 0)
      std::printf("  %lld of %lld elements NaN/inf or unwritten", static_cast<long long>(e.not_finite),
                  static_cast<long long>(e.compared));
    std::printf("%s\n", e.passed() ? "" : "  <-- FAILED");
  }
  return c.passed();
}

void report_timing(const char* direction, Backend backend, double ms, int iters, double flops) {
  const double rate = flops / (ms * 1e-3);
  std::printf("%-9s %s: median %.3f ms over %d runs, ", direction, backend_name(backend), ms, iters);
  if (rate >= 1e12)
    std::printf("%.1f TFLOP/s\n", rate / 1e12);
  else
    std::printf("%.2f GFLOP/s\n", rate / 1e9);
}

// "CPU", or the GPU's name and the compiled architectures.
std::string device_description(const ProblemSpec& s) {
  std::string text = "CPU";
#if CUTEATTN_WITH_CUDA
  cudaDeviceProp prop{};
  if (s.gpu && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    text = std::string("GPU ") + prop.name + " (sm_" + std::to_string(prop.major * 10 + prop.minor) +
           "; kernels compiled for " + compiled_archs() + ")";
#endif
  (void)s;
  return text;
}

int run(const ProblemSpec& spec) {
  std::printf("cuteattn %s | %s | requested backend %s\n", version(), device_description(spec).c_str(),
              backend_name(spec.backend));
  std::printf("problem   %s\n", describe(spec).c_str());
  std::fflush(stdout);

  ProblemTensors tensors(spec);
  const ForwardArgs fwd = tensors.forward_args(spec);
  Status st = check_forward(fwd);
  if (!st.ok()) return fail("refused", st);
  const bool do_forward = spec.direction != Direction::kBackward;
  const bool do_backward = spec.direction != Direction::kForward;
  const double flops = forward_flops(spec);
  bool passed = true;

  tensors.out.poison();
  tensors.lse.poison();
  Backend fwd_backend = spec.backend;
  st = resolve_backend(fwd, &fwd_backend);
  if (st.ok()) st = attention_forward(fwd);
  if (st.ok()) st = device_sync(spec);
  if (!st.ok()) return fail("forward", st);
  if (do_forward) {
    RunOutputs outputs;
    outputs.out = tensors.out.download();
    outputs.lse = tensors.lse.download();
    const double ms = median_ms(
        spec, spec.iters, [&] { return attention_forward(fwd); }, &st);
    if (!st.ok()) return fail("forward", st);
    report_timing("forward", fwd_backend, ms, spec.iters, flops);
    std::fflush(stdout);
    passed = report_check(check_against_oracle(spec, outputs, false)) && passed;
  }
  if (do_backward) {
    const BackwardArgs bwd = tensors.backward_args(spec);
    for (Buffer* b : {&tensors.dq, &tensors.dk, &tensors.dv, &tensors.drab}) b->poison();
    Backend bwd_backend = spec.backend;
    st = resolve_backend(bwd, &bwd_backend);
    if (st.ok()) st = attention_backward(bwd);
    if (st.ok()) st = device_sync(spec);
    if (!st.ok()) return fail("backward", st);
    RunOutputs outputs;
    outputs.dq = tensors.dq.download();
    outputs.dk = tensors.dk.download();
    outputs.dv = tensors.dv.download();
    outputs.drab = tensors.drab.download();
    const double ms = median_ms(
        spec, spec.iters, [&] { return attention_backward(bwd); }, &st);
    if (!st.ok()) return fail("backward", st);
    report_timing("backward", bwd_backend, ms, spec.iters, 2.5 * flops);
    std::fflush(stdout);
    passed = report_check(check_against_oracle(spec, outputs, true)) && passed;
    if (spec.deterministic) {
      const bool same = tensors.dq.download() == outputs.dq && tensors.dk.download() == outputs.dk &&
                        tensors.dv.download() == outputs.dv && tensors.drab.download() == outputs.drab;
      std::printf("  determinism %s: the last timed run's gradients %s the checked run's\n", same ? "ok" : "FAILED",
                  same ? "are bit-identical to" : "differ from");
      passed = same && passed;
    }
  }
  return passed ? 0 : 1;
}

}  // namespace

double forward_flops(const ProblemSpec& s) {
  double flops = 0.0;
  for (int64_t bi = 0; bi < s.b; ++bi)
    flops +=
        2.0 * static_cast<double>(s.h) * static_cast<double>(s.d + s.dv) * visible_pairs(s, s.len_q(bi), s.len_k(bi));
  return flops;
}

int run_cli(const CliOptions& options) {
  ProblemSpec spec;
  std::string error;
  if (!make_spec(options, cuda_available(), &spec, &error)) {
    std::fprintf(stderr, "cuteattn-cli: %s\n", error.c_str());
    return 2;
  }
  if (options.demo) std::printf("(demo problem; cuteattn-cli --help lists the flags)\n");
  try {
    return run(spec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuteattn-cli: %s\n", e.what());
    return 1;
  }
}

}  // namespace cuteattn::cli
