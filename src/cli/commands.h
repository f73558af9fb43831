// Each subcommand registers its options on the app and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace opfuse::cli {

using Run = std::function<int()>;

Run add_bench_op(CLI::App& app);
Run add_train(CLI::App& app);
Run add_analyze(CLI::App& app);
Run add_tune(CLI::App& app);
Run add_rewrite(CLI::App& app);

}  // namespace opfuse::cli
