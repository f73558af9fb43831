// opfuse: find chains of small operators in a PyTorch training run and fuse them.
// The only place that parses arguments or prints for people; exit codes per DESIGN.md:
// 0 success, 1 the job ran and refused, 2 bad input or usage (one line on stderr).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/plugin.h"
#include "opfuse/errors.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "opfuse: error: %s\n", message.c_str());
  return 2;
}


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"opfuse: profile a PyTorch training run, find small-op chains, fuse them"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "opfuse 0.1.0");
  std::vector<opfuse::cli::Run> commands{opfuse::cli::add_analyze(app)};
  try {
    // `opfuse analyze …` never needs LibTorch to parse its arguments; everything else might.
    if (!(argc > 1 && std::string(argv[1]) == "analyze"))
      reinterpret_cast<opfuse::cli::AddTorchCommands>(opfuse::cli::torch_symbol("opfuse_add_torch_commands"))(app,
                                                                                                     commands);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  }
  try {
    for (const auto& run : commands) {
      const int code = run();
      if (code >= 0) return code;
    }
    return fail("no command given (see opfuse --help)");
  } catch (const std::invalid_argument& e) {
    return fail(opfuse::error_summary(e.what()));
  } catch (const std::exception& e) {
    return fail(opfuse::error_summary(e.what()));
  }
}
