#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/progress.h"
#include "opfuse/bench.h"
#include "opfuse/report.h"

namespace opfuse::cli {
namespace {

struct BenchOpArgs {
  bench::OpBenchOptions options;
  std::string json;
  bool force = false;
};

}  // namespace

Run add_bench_op(CLI::App& app) {
  auto args = std::make_shared<BenchOpArgs>();
  auto* cmd = app.add_subcommand("bench-op", "Time a fused op against the composite it replaces and ATen");
  cmd->add_option("NAME", args->options.op, fmt::format("{}", fmt::join(bench::benchmarked_ops(), " | ")))
      ->required()
      ->check(CLI::IsMember(bench::benchmarked_ops()));
  cmd->add_option("--numel", args->options.numel,
                  "elements per tensor (default 6400000; se_gate, batch_norm_silu, drop_connect_add: [16, C, 56, 56] "
                  "of about that size, default [16, 96, 56, 56] for the last two; rms_norm: [numel / 768, 768], default "
                  "[1024, 768]; swiglu: gate and up [numel / 2048, 2048], default [1024, 2048]; rotary_embedding: x [4, T, 8, 64] of about "
                  "that size, default [4, 256, 8, 64]; cross_entropy, linear_cross_entropy: logits [numel / 32000, 32000], default "
                  "[1024, 32000]; not for attention, or adamw and sgd, which step stories15M's 56 parameter tensors)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seq-len", args->options.seq_len, "attention: tokens T of q, k, v [4, 6, T, head-dim]")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--head-dim", args->options.head_dim, "attention: head dimension D")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dropout", args->options.dropout_p, "attention: dropout probability on the attention weights")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--threads", args->options.threads, "intra-op threads (0: all cores)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rounds", args->options.rounds, "timed rounds, each variant once per round, the order rotating")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", args->options.warmup, "untimed rounds first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--json", args->json, "also write the result as JSON to FILE");
  cmd->add_flag("--force", args->force, "replace an existing --json file");

  return [cmd, args]() {
    if (!cmd->parsed()) return -1;
    auto progress = std::make_shared<Progress>("bench-op " + args->options.op);
    args->options.progress = [progress](int done, int total) { progress->update(done, total); };
    if (!args->json.empty()) report::check_output_path(args->json, args->force);
    const auto result = bench::bench_op(args->options);
    progress->clear();
    std::fputs(report::format_op_bench(result).c_str(), stdout);
    if (!args->json.empty()) report::write_json(args->json, report::op_bench_json(result), args->force);
    return 0;
  };
}

}  // namespace opfuse::cli
