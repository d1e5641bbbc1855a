// Parsing and validation of cuteattn-cli's flags (--name value or --name=value) and the usage text.
#include "cli_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

namespace cuteattn::cli {
namespace {

bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_float(const std::string& text, float* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// A flag that takes a value: stores it or explains why it is bad.
using Setter = std::function<bool(const std::string& value, CliOptions& o, std::string* why)>;

Setter int_at_least(int64_t lo, std::optional<int64_t> CliOptions::*field) {
  return [lo, field](const std::string& v, CliOptions& o, std::string* why) {
    int64_t n;
    if (!parse_int(v, &n) || n < lo) {
      *why = "expected an integer >= " + std::to_string(lo);
      return false;
    }
    o.*field = n;
    return true;
  };
}

Setter plain_int_at_least(int64_t lo, int64_t CliOptions::*field) {
  return [lo, field](const std::string& v, CliOptions& o, std::string* why) {
    int64_t n;
    if (!parse_int(v, &n) || n < lo) {
      *why = "expected an integer >= " + std::to_string(lo);
      return false;
    }
    o.*field = n;
    return true;
  };
}

template <typename T>
Setter choice(const std::map<std::string, T>& names, const std::string& listed,
              std::function<void(CliOptions&, T)> set) {
  return [names, listed, set](const std::string& v, CliOptions& o, std::string* why) {
    const auto it = names.find(v);
    if (it == names.end()) {
      *why = "expected one of " + listed;
      return false;
    }
    set(o, it->second);
    return true;
  };
}

const std::map<std::string, Setter>& value_flags() {
  static const std::map<std::string, Setter> flags = {
      {"--batch", int_at_least(1, &CliOptions::batch)},
      {"--seqlen-q", int_at_least(0, &CliOptions::seqlen_q)},
      {"--seqlen-k", int_at_least(0, &CliOptions::seqlen_k)},
      {"--heads", int_at_least(1, &CliOptions::heads)},
      {"--heads-k", int_at_least(1, &CliOptions::heads_k)},
      {"--head-dim", int_at_least(1, &CliOptions::head_dim)},
      {"--head-dim-v", int_at_least(1, &CliOptions::head_dim_v)},
      {"--iters", int_at_least(1, &CliOptions::iters)},
      {"--contexts", plain_int_at_least(0, &CliOptions::contexts)},
      {"--targets", plain_int_at_least(0, &CliOptions::targets)},
      {"--group-size", plain_int_at_least(1, &CliOptions::group_size)},
      {"--check-rows", plain_int_at_least(0, &CliOptions::check_rows)},
      {"--dtype", choice<DType>({{"fp16", DType::kFloat16}, {"bf16", DType::kBFloat16}, {"fp32", DType::kFloat32}},
                                "fp16, bf16, fp32", [](CliOptions& o, DType d) { o.dtype = d; })},
      {"--score", choice<ScoreFunction>({{"softmax", ScoreFunction::kSoftmax}, {"hstu", ScoreFunction::kHstuSilu}},
                                        "softmax, hstu", [](CliOptions& o, ScoreFunction s) { o.score = s; })},
      {"--rab", choice<RabMode>({{"none", RabMode::kNone}, {"1", RabMode::kShared}, {"h", RabMode::kPerHead}},
                                "none, 1, h", [](CliOptions& o, RabMode r) { o.rab = r; })},
      {"--direction",
       choice<Direction>({{"fwd", Direction::kForward}, {"bwd", Direction::kBackward}, {"both", Direction::kBoth}},
                         "fwd, bwd, both", [](CliOptions& o, Direction d) { o.direction = d; })},
      {"--backend",
       choice<BackendChoice>({{"auto", BackendChoice::kAuto},
                              {"cpu", BackendChoice::kCpu},
                              {"ref", BackendChoice::kReference},
                              {"sm80", BackendChoice::kSm80},
                              {"sm90", BackendChoice::kSm90}},
                             "auto, cpu, ref, sm80, sm90", [](CliOptions& o, BackendChoice b) { o.backend = b; })},
      {"--window",
       [](const std::string& v, CliOptions& o, std::string* why) {
         const size_t comma = v.find(',');
         int64_t l, r;
         if (comma == std::string::npos || !parse_int(v.substr(0, comma), &l) || !parse_int(v.substr(comma + 1), &r) ||
             l < -1 || r < -1) {
           *why = "expected L,R with each >= 0 or -1 (unbounded)";
           return false;
         }
         o.window_left = l;
         o.window_right = r;
         return true;
       }},
      {"--softcap",
       [](const std::string& v, CliOptions& o, std::string* why) {
         if (!parse_float(v, &o.softcap) || o.softcap < 0.0f) {
           *why = "expected a number >= 0";
           return false;
         }
         return true;
       }},
      {"--alpha",
       [](const std::string& v, CliOptions& o, std::string* why) {
         float a;
         if (!parse_float(v, &a)) {
           *why = "expected a finite number";
           return false;
         }
         o.alpha = a;
         return true;
       }},
      {"--seed",
       [](const std::string& v, CliOptions& o, std::string* why) {
         char* end = nullptr;
         errno = 0;
         const unsigned long long s = std::strtoull(v.c_str(), &end, 10);
         if (v.empty() || v[0] == '-' || errno != 0 || *end != '\0') {
           *why = "expected a non-negative integer";
           return false;
         }
         o.seed = s;
         return true;
       }},
  };
  return flags;
}

const std::map<std::string, bool CliOptions::*>& switch_flags() {
  static const std::map<std::string, bool CliOptions::*> flags = {
      {"--causal", &CliOptions::causal},
      {"--varlen", &CliOptions::varlen},
      {"--deterministic", &CliOptions::deterministic},
      {"--help", &CliOptions::help},
      {"-h", &CliOptions::help},
  };
  return flags;
}

}  // namespace

bool parse_cli_flags(const std::vector<std::string>& args, CliOptions* options, std::string* error) {
  CliOptions o;
  o.demo = args.empty();
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    bool has_value = false;
    const size_t eq = name.find('=');
    if (name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const auto sw = switch_flags().find(name);
    if (sw != switch_flags().end()) {
      if (has_value) {
        *error = name + " takes no value";
        return false;
      }
      o.*(sw->second) = true;
      continue;
    }
    const auto fl = value_flags().find(name);
    if (fl == value_flags().end()) {
      *error = "unknown flag " + args[i] + " (see --help)";
      return false;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        *error = name + " needs a value";
        return false;
      }
      value = args[++i];
    }
    std::string why;
    if (!fl->second(value, o, &why)) {
      *error = name + ": bad value '" + value + "': " + why;
      return false;
    }
  }
  *options = o;
  return true;
}

std::string cli_usage() {
  return R"(usage: cuteattn-cli [flags]
Runs attention on random normal inputs, checks the result against the float64 oracle (kCpuReference on
the same inputs, for a few (batch, kv-head) slices) and prints the median time, TFLOP/s and the error.
With no flags: a demo on the best backend present (GPU when available, else the CPU).

problem
  --batch B            sequences (default GPU 4, CPU 2)
  --seqlen-q S         query length; with --varlen the maximum (default GPU 2048, CPU 256)
  --seqlen-k S         key length (default: --seqlen-q)
  --heads H            query heads (default GPU 16, CPU 4)
  --heads-k H          key/value heads, dividing H (default: --heads)
  --head-dim D         head dim of q and k (default GPU 128, CPU 64)
  --head-dim-v D       head dim of v and the output (default: --head-dim)
  --dtype T            fp16 | bf16 | fp32 (default GPU bf16, CPU fp32)
  --varlen             jagged layout, each length drawn uniformly in [0.9*max, max]
score and mask
  --score F            softmax | hstu (hstu always uses the jagged layout; alpha defaults to 1/d)
  --causal             causal mask
  --window L,R         local window, -1 = unbounded side
  --softcap C          softmax only: S = C * tanh(S / C)
  --alpha A            hstu only
  --rab M              hstu only: none | 1 (shared by heads) | h (one per head)
  --contexts N         hstu: the first N keys of each sequence are contextual (needs --causal)
  --targets N          hstu: the last N keys of each sequence are targets (needs --causal)
  --group-size G       hstu: target group size (default 1)
run
  --direction D        fwd | bwd | both (default both)
  --backend B          auto | cpu | ref | sm80 | sm90 (default auto)
  --deterministic      deterministic backward (the CLI checks the last run is bit-identical to the first)
  --iters N            timed runs after one warm-up (default GPU 20, CPU 3)
  --seed N             input seed (default 0)
  --check-rows N       check only the last N query rows of each slice (0: no check; default: whole
                       slices when the oracle can afford them, else the last 64 rows)
  --help               this text

FLOPs: forward 2*h*s_q*s_k*(d+d_v) per sequence (its own lengths), halved for causal; local windows count
the visible pairs; backward 2.5 x forward. Exit codes: 0 ok, 1 check failed or run error, 2 bad flags or a
problem the library refuses.
)";
}

}  // namespace cuteattn::cli
