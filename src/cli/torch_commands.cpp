// libopfuse_commands.so's entry points: the commands that need LibTorch, and the fused-op timer
// analyze uses. c10 errors become std::runtime_error with their one useful line, because the binary
// that catches them knows nothing of c10.
#include <c10/util/Exception.h>

#include <stdexcept>

#include "cli/plugin.h"
#include "opfuse/bench.h"
#include "opfuse/errors.h"

namespace {

opfuse::cli::Run without_c10_errors(opfuse::cli::Run run) {
  return [run]() {
    try {
      return run();
    } catch (const c10::Error& e) {
      throw std::runtime_error(opfuse::error_summary(e.what_without_backtrace()));
    }
  };
}

}  // namespace

extern "C" {

void opfuse_add_torch_commands(CLI::App& app, std::vector<opfuse::cli::Run>& commands) {
  commands.push_back(without_c10_errors(opfuse::cli::add_train(app)));
  commands.push_back(without_c10_errors(opfuse::cli::add_bench_op(app)));
  commands.push_back(without_c10_errors(opfuse::cli::add_tune(app)));
  commands.push_back(without_c10_errors(opfuse::cli::add_rewrite(app)));
}

double opfuse_time_fused_op(const char* op, const char* dims) {
  try {
    return opfuse::bench::time_fused_op(op, dims);
  } catch (const std::exception&) {
    return -1;  // a shape the op rejects: the caller falls back to the bandwidth model
  }
}

// This machine's peaks at `threads` threads (measured once, then cached); false when they could not be had.
bool opfuse_machine_roofline(int threads, double* flops_per_s, double* bytes_per_s) {
  try {
    const auto r = opfuse::bench::machine_roofline(threads);
    *flops_per_s = r.flops_per_s, *bytes_per_s = r.bytes_per_s;
    return r.known();
  } catch (const std::exception&) {
    return false;
  }
}

}  // extern "C"
