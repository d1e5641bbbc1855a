// cuteattn-cli: runs, times and checks one attention problem given by flags (cuteattn-cli --help).
#include <cstdio>
#include <string>
#include <vector>

#include "cli_flags.h"
#include "run_report.h"

int main(int argc, char** argv) {
  using namespace cuteattn::cli;
  CliOptions options;
  std::string error;
  if (!parse_cli_flags(std::vector<std::string>(argv + 1, argv + argc), &options, &error)) {
    std::fprintf(stderr, "cuteattn-cli: %s\n", error.c_str());
    return 2;
  }
  if (options.help) {
    std::fputs(cli_usage().c_str(), stdout);
    return 0;
  }
  return run_cli(options);
}
