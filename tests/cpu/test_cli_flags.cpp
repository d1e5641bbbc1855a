// cuteattn-cli's flag parser (tools/cli/cli_flags.cpp): accepted forms, defaults left unset, refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_flags.h"

namespace {

using namespace cuteattn;
using namespace cuteattn::cli;

struct Parsed {
  bool ok = false;
  CliOptions options;
  std::string error;
};

Parsed parse(const std::vector<std::string>& args) {
  Parsed p;
  p.ok = parse_cli_flags(args, &p.options, &p.error);
  return p;
}

// A refusal names the offending flag at the start of its one-line message.
void expect_refused(const std::vector<std::string>& args, const std::string& starts_with) {
  const Parsed p = parse(args);
  EXPECT_FALSE(p.ok) << args[0];
  EXPECT_EQ(p.error.rfind(starts_with, 0), 0u) << p.error;
  EXPECT_EQ(p.error.find('\n'), std::string::npos) << p.error;
}

TEST(CliFlags, NoFlagsIsTheDemo) {
  const Parsed p = parse({});
  ASSERT_TRUE(p.ok);
  EXPECT_TRUE(p.options.demo);
  EXPECT_FALSE(p.options.batch.has_value());
  EXPECT_FALSE(p.options.dtype.has_value());
}

TEST(CliFlags, FullProblem) {
  const Parsed p = parse(
      {"--batch",        "3",        "--seqlen-q", "113",       "--seqlen-k",   "4224",     "--heads",      "16",
       "--heads-k",      "2",        "--head-dim", "192",       "--head-dim-v", "128",      "--dtype",      "fp16",
       "--causal",       "--window", "64,0",       "--softcap", "30",           "--varlen", "--direction",  "bwd",
       "--backend",      "sm80",     "--iters",    "7",         "--seed",       "42",       "--check-rows", "16",
       "--deterministic"});
  ASSERT_TRUE(p.ok) << p.error;
  const CliOptions& o = p.options;
  EXPECT_FALSE(o.demo);
  EXPECT_EQ(*o.batch, 3);
  EXPECT_EQ(*o.seqlen_q, 113);
  EXPECT_EQ(*o.seqlen_k, 4224);
  EXPECT_EQ(*o.heads, 16);
  EXPECT_EQ(*o.heads_k, 2);
  EXPECT_EQ(*o.head_dim, 192);
  EXPECT_EQ(*o.head_dim_v, 128);
  EXPECT_EQ(*o.dtype, DType::kFloat16);
  EXPECT_TRUE(o.causal);
  EXPECT_EQ(o.window_left, 64);
  EXPECT_EQ(o.window_right, 0);
  EXPECT_FLOAT_EQ(o.softcap, 30.0f);
  EXPECT_TRUE(o.varlen);
  EXPECT_EQ(o.direction, Direction::kBackward);
  EXPECT_EQ(o.backend, BackendChoice::kSm80);
  EXPECT_EQ(*o.iters, 7);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_EQ(o.check_rows, 16);
  EXPECT_TRUE(o.deterministic);
}

TEST(CliFlags, HstuFlags) {
  const Parsed p = parse({"--score", "hstu", "--alpha", "0.0078125", "--rab", "h", "--contexts", "5", "--targets", "20",
                          "--group-size", "4", "--causal"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.options.score, ScoreFunction::kHstuSilu);
  EXPECT_FLOAT_EQ(*p.options.alpha, 0.0078125f);
  EXPECT_EQ(p.options.rab, RabMode::kPerHead);
  EXPECT_EQ(p.options.contexts, 5);
  EXPECT_EQ(p.options.targets, 20);
  EXPECT_EQ(p.options.group_size, 4);
  EXPECT_EQ(parse({"--rab", "1"}).options.rab, RabMode::kShared);
  EXPECT_EQ(parse({"--rab", "none"}).options.rab, RabMode::kNone);
}

TEST(CliFlags, EqualsForm) {
  const Parsed p = parse({"--batch=5", "--dtype=bf16", "--window=-1,8", "--backend=ref"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(*p.options.batch, 5);
  EXPECT_EQ(*p.options.dtype, DType::kBFloat16);
  EXPECT_EQ(p.options.window_left, -1);
  EXPECT_EQ(p.options.window_right, 8);
  EXPECT_EQ(p.options.backend, BackendChoice::kReference);
}

TEST(CliFlags, EveryChoiceValue) {
  EXPECT_EQ(*parse({"--dtype", "fp32"}).options.dtype, DType::kFloat32);
  EXPECT_EQ(parse({"--direction", "fwd"}).options.direction, Direction::kForward);
  EXPECT_EQ(parse({"--direction", "both"}).options.direction, Direction::kBoth);
  EXPECT_EQ(parse({"--backend", "auto"}).options.backend, BackendChoice::kAuto);
  EXPECT_EQ(parse({"--backend", "cpu"}).options.backend, BackendChoice::kCpu);
  EXPECT_EQ(parse({"--backend", "sm90"}).options.backend, BackendChoice::kSm90);
  EXPECT_EQ(parse({"--score", "softmax"}).options.score, ScoreFunction::kSoftmax);
}

TEST(CliFlags, ZeroLengthsAndNoCheckAreAllowed) {
  const Parsed p = parse({"--seqlen-q", "0", "--seqlen-k", "0", "--check-rows", "0"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(*p.options.seqlen_q, 0);
  EXPECT_EQ(p.options.check_rows, 0);
}

TEST(CliFlags, Help) {
  EXPECT_TRUE(parse({"--help"}).options.help);
  EXPECT_TRUE(parse({"-h"}).options.help);
  EXPECT_NE(cli_usage().find("--seqlen-q"), std::string::npos);
  EXPECT_NE(cli_usage().find("--check-rows"), std::string::npos);
}

TEST(CliFlags, UnknownFlag) {
  expect_refused({"--bogus"}, "unknown flag --bogus");
  expect_refused({"batch", "2"}, "unknown flag batch");
  expect_refused({"--batch", "2", "-x"}, "unknown flag -x");
}

TEST(CliFlags, MissingValue) { expect_refused({"--heads"}, "--heads needs a value"); }

TEST(CliFlags, SwitchWithValue) { expect_refused({"--causal=yes"}, "--causal takes no value"); }

TEST(CliFlags, BadIntegers) {
  expect_refused({"--batch", "0"}, "--batch: bad value '0'");
  expect_refused({"--batch", "two"}, "--batch: bad value 'two'");
  expect_refused({"--batch", "3x"}, "--batch: bad value '3x'");
  expect_refused({"--seqlen-q", "-1"}, "--seqlen-q: bad value '-1'");
  expect_refused({"--heads-k", "0"}, "--heads-k: bad value '0'");
  expect_refused({"--head-dim", "0"}, "--head-dim: bad value '0'");
  expect_refused({"--head-dim-v", ""}, "--head-dim-v: bad value ''");
  expect_refused({"--iters", "0"}, "--iters: bad value '0'");
  expect_refused({"--contexts", "-2"}, "--contexts: bad value '-2'");
  expect_refused({"--targets", "1.5"}, "--targets: bad value '1.5'");
  expect_refused({"--group-size", "0"}, "--group-size: bad value '0'");
  expect_refused({"--check-rows", "-1"}, "--check-rows: bad value '-1'");
  expect_refused({"--seqlen-k", "99999999999999999999999"}, "--seqlen-k: bad value");
}

TEST(CliFlags, BadChoices) {
  expect_refused({"--dtype", "fp8"}, "--dtype: bad value 'fp8'");
  expect_refused({"--score", "relu"}, "--score: bad value 'relu'");
  expect_refused({"--rab", "2"}, "--rab: bad value '2'");
  expect_refused({"--direction", "up"}, "--direction: bad value 'up'");
  expect_refused({"--backend", "sm100"}, "--backend: bad value 'sm100'");
}

TEST(CliFlags, BadWindow) {
  expect_refused({"--window", "8"}, "--window: bad value '8'");
  expect_refused({"--window", "-2,0"}, "--window: bad value '-2,0'");
  expect_refused({"--window", "1,a"}, "--window: bad value '1,a'");
  expect_refused({"--window", ","}, "--window: bad value ','");
}

TEST(CliFlags, BadNumbers) {
  expect_refused({"--softcap", "-1"}, "--softcap: bad value '-1'");
  expect_refused({"--softcap", "inf"}, "--softcap: bad value 'inf'");
  expect_refused({"--alpha", "nan"}, "--alpha: bad value 'nan'");
  expect_refused({"--seed", "-3"}, "--seed: bad value '-3'");
}

}  // namespace
