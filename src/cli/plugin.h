// The LibTorch half of the command line, in libopfuse_commands.so next to the opfuse binary.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/commands.h"

namespace opfuse::cli {

// Entry points the library exports with C linkage (torch_commands.cpp).
using AddTorchCommands = void (*)(CLI::App& app, std::vector<Run>& commands);
using TimeFusedOp = double (*)(const char* op, const char* dims);
using MachineRoofline = bool (*)(int threads, double* flops_per_s, double* bytes_per_s);

// Loads the library once; throws std::runtime_error naming it when it cannot.
void* torch_symbol(const char* name);

}  // namespace opfuse::cli
