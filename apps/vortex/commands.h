// The vortex subcommands. Each file apps/vortex/cmd_<name>.cc registers one subcommand on the
// app; the callback runs after parsing and returns the process exit code.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "vortex/status.h"

namespace vortex::cli {

// Set by a subcommand's parse callback; main() runs it once parsing succeeded.
using Action = std::function<int()>;

void add_generate_command(CLI::App& app, Action& action);
void add_inspect_command(CLI::App& app, Action& action);
void add_convert_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);
void add_decode_command(CLI::App& app, Action& action);
void add_encode_text_command(CLI::App& app, Action& action);
void add_encode_keyframe_command(CLI::App& app, Action& action);
#if defined(VORTEX_HAVE_SERVICE)
void add_serve_command(CLI::App& app, Action& action);
#endif

// Prints "vortex: <message>" on one line to stderr and returns the exit code for a Status:
// 2 for bad input (invalid argument, not found, corrupt data), 1 otherwise.
int report_error(const Status& status);

}  // namespace vortex::cli
