// cuteattn-cli correctness check: compares a run's outputs with the float64 oracle (Backend::kCpuReference)
// on a few (batch, kv-head) slices, each rebuilt as a one-sequence fp32 problem from the same input values.
// Slices the oracle cannot afford are cut to their last query rows (which keep their mask alignment); then
// only out, lse and dq are compared, since dk, dv and drab sum over every row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem_setup.h"

namespace cuteattn::cli {

// One output tensor's agreement with the oracle.
struct ErrorStat {
  std::string name;
  double max_err = 0.0;  // max |ours - oracle| over compared elements
  double max_ref = 0.0;  // max |oracle|
  int64_t compared = 0;
  int64_t not_finite = 0;  // ours NaN/inf where the oracle is finite (or unwritten poison)
  double tolerance = 0.0;  // on max_err / max_ref
  bool passed() const;
};

struct CheckResult {
  bool ran = false;
  std::string scope;  // which slices and rows were compared
  std::vector<ErrorStat> stats;
  std::string error;  // the oracle itself failed
  bool passed() const;
};

// Host copies of a run's outputs, in the problem's dtype (lse float32).
struct RunOutputs {
  std::vector<unsigned char> out, lse, dq, dk, dv, drab;
};

CheckResult check_against_oracle(const ProblemSpec& spec, const RunOutputs& ours, bool backward);

}  // namespace cuteattn::cli
