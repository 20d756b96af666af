// vortex: the command-line front end of the MiniMax-H3 runtime.
#include <cstdio>

#include "commands.h"

namespace vortex::cli {

int report_error(const Status& status) {
  std::fprintf(stderr, "vortex: %s\n", status.to_string().c_str());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruptData:
      return 2;
    default:
      return 1;
  }
}

}  // namespace vortex::cli

int main(int argc, char** argv) {
  CLI::App app{"vortex: a C++/CUDA runtime for MiniMax-H3 (text to video with sound)"};
  app.require_subcommand(1);
  vortex::cli::Action action;
  vortex::cli::add_generate_command(app, action);
  vortex::cli::add_inspect_command(app, action);
  vortex::cli::add_convert_command(app, action);
  vortex::cli::add_decode_command(app, action);
  vortex::cli::add_encode_text_command(app, action);
  vortex::cli::add_encode_keyframe_command(app, action);
  vortex::cli::add_bench_command(app, action);
#if defined(VORTEX_HAVE_SERVICE)
  vortex::cli::add_serve_command(app, action);
#else
  // A build without cpp-httplib (the GPU machine's) still knows the command, to say why it cannot run.
  app.add_subcommand("serve", "HTTP service: not in this build (cpp-httplib was not found)")
      ->allow_extras()
      ->callback([&action] {
        action = [] {
          return vortex::cli::report_error(vortex::unimplemented(
              "serve: this build has no HTTP service (cpp-httplib was not found when it was configured)"));
        };
      });
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return action ? action() : 0;
}
