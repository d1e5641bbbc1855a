// cuteattn-cli command line: the options, their parser and the usage text. No library calls, so the
// parser is unit-tested on its own (tests/cpu/test_cli_flags.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuteattn/attention.h"

namespace cuteattn::cli {

enum class Direction { kForward, kBackward, kBoth };
enum class BackendChoice { kAuto, kCpu, kReference, kSm80, kSm90 };
enum class RabMode { kNone, kShared, kPerHead };  // --rab none | 1 | h

// What the command line says; unset optionals take defaults that depend on the device (see resolve_defaults).
struct CliOptions {
  std::optional<int64_t> batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, head_dim_v;
  std::optional<DType> dtype;
  ScoreFunction score = ScoreFunction::kSoftmax;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  std::optional<float> alpha;
  RabMode rab = RabMode::kNone;
  int64_t contexts = 0, targets = 0, group_size = 1;
  bool varlen = false;
  bool deterministic = false;
  Direction direction = Direction::kBoth;
  BackendChoice backend = BackendChoice::kAuto;
  std::optional<int64_t> iters;
  uint64_t seed = 0;
  int64_t check_rows = -1;  // -1: whole slices when the oracle can afford them, else the last 64 rows
  bool demo = false;        // no flags at all
  bool help = false;
};

// Parses argv[1..]; on failure returns false and sets *error to a one-line message.
bool parse_cli_flags(const std::vector<std::string>& args, CliOptions* options, std::string* error);

std::string cli_usage();

}  // namespace cuteattn::cli
