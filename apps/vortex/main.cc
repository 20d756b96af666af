// vortex: the command-line front end (generate, inspect, convert, bench).
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"vortex: a C++/CUDA runtime for MiniMax-H3"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
