// cuteattn-cli run and report: sets the problem up, runs the requested directions, times them, checks them
// against the oracle and prints one block per direction.
#pragma once

#include "cli_flags.h"
#include "problem_setup.h"

namespace cuteattn::cli {

// FLOPs of one forward call (FlashAttention convention, /work/shared/TARGETS.md); backward is 2.5x.
double forward_flops(const ProblemSpec& spec);

// Runs what the options ask for; returns the process exit code (0 ok, 1 failed check or run, 2 refused).
int run_cli(const CliOptions& options);

}  // namespace cuteattn::cli
