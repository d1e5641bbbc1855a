// Case lists that several GPU suites run through different kernels or passes (sm80 forward and backward, sm90
// forward), so each list is written once.
#pragma once

#include <cstdint>
#include <vector>

#include "common/test_util.h"

namespace cuteattn::test {

// A head-dim bucket the main tests do not reach (32, 96, 192, 256): both dtypes, causal and not, odd lengths,
// GQA once, varlen with empty sequences once, HSTU with a 1-head rab (+ dRab for the backward) and targets once.
std::vector<CaseConfig> bucket_cases(int64_t head_dim);

// Softmax cases at the edges of key blocks (sm90's 112- and 80-key blocks of d 192 / 256, which are no power of
// 2; the sm80 8-warp tiles, whose warps leave masked blocks their rows do not see): lengths that are no multiple
// of the blocks, causal and not with s_q = s_k, s_q < s_k and s_q > s_k, a window whose edges cut blocks, varlen
// sequences of one block, one row and none. Short enough for the float64 oracle.
std::vector<CaseConfig> key_block_edge_cases(int64_t head_dim);

// HSTU without a causal mask, with rab of h heads, unbounded and under three local windows (d = 128).
std::vector<CaseConfig> hstu_window_cases();

// HSTU causal with contexts and targets: target group sizes 1, 3, 8, 128 over jagged lengths (0, 1, 1016 among
// them) with 1- and h-head rab, then a whole-sequence target group and a context covering all but one row.
std::vector<CaseConfig> hstu_context_target_cases();

}  // namespace cuteattn::test
