// vortex encode-text: a prompt through the tokenizer and the Qwen3-VL text encoder into the text
// states `generate --text` and the served multipart `text` part take (the tensor `prompt_embeds`,
// [tokens, hidden] bf16, and `input_ids`), so that one encoding can serve many generations.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "formats/safetensors.h"
#include "text/text_conditioner.h"

namespace vortex::cli {

namespace {

struct EncodeTextArgs {
  text::TextConditionerOptions text;
  std::string prompt;
  std::string prompt_file;
  std::string out;
  bool print_ids = false;
};

Result<std::string> read_prompt(const EncodeTextArgs& args) {
  if (args.prompt_file.empty()) return args.prompt;
  std::ifstream in(args.prompt_file, std::ios::binary);
  if (!in) return not_found("--prompt-file " + args.prompt_file + ": cannot open");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int run_encode_text(const EncodeTextArgs& args) {
  auto prompt = read_prompt(args);
  if (!prompt.ok()) return report_error(prompt.status());
  auto conditioner = text::TextConditioner::load(args.text);
  if (!conditioner.ok()) return report_error(conditioner.status());
  auto ids = (*conditioner)->tokenize(*prompt);
  if (!ids.ok()) return report_error(ids.status());
  if (args.print_ids) std::printf("%s\n", nlohmann::json(*ids).dump().c_str());
  const auto start = std::chrono::steady_clock::now();
  auto states = (*conditioner)->encode(*ids);
  if (!states.ok()) return report_error(states.status());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<int64_t> ids64(ids->begin(), ids->end());
  const nlohmann::json summary = {{"prompt", *prompt}, {"tokens", ids->size()},
                                  {"text_encoder", (*conditioner)->describe()}, {"seconds", seconds}};
  const Status written = write_safetensors(
      args.out,
      {{"prompt_embeds", *states}, {"input_ids", Tensor::from_i64(ids64, {static_cast<int64_t>(ids64.size())})}},
      {{"vortex", summary.dump()}});
  if (!written.ok()) return report_error(written);
  std::printf("%zu tokens -> prompt_embeds %s in %.2f s; wrote %s\n", ids->size(), states->describe().c_str(),
              seconds, args.out.c_str());
  return 0;
}

}  // namespace

void add_encode_text_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<EncodeTextArgs>();
  CLI::App* cmd = app.add_subcommand(
      "encode-text", "Encode a prompt into H3 text states (Qwen3-VL layer-50 hidden states) for generate --text");
  cmd->add_option("--text-encoder", args->text.encoder_path,
                  "Qwen3-VL checkpoint folder (config.json, model*.safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("--tokenizer", args->text.tokenizer_path, "tokenizer.json (default: the text encoder's)");
  cmd->add_option("--device", args->text.device, "Where the encoder runs (cuda: its layers' weights on the device)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--text-encoder-layer", args->text.layer,
                  "The layer whose output conditions H3 (the released model: 50)")
      ->capture_default_str();
  auto* prompt = cmd->add_option("--prompt", args->prompt, "The prompt (UTF-8)");
  auto* prompt_file = cmd->add_option("--prompt-file", args->prompt_file, "A file holding the prompt, read verbatim");
  prompt->excludes(prompt_file);
  cmd->add_option("--out", args->out, "Output .safetensors (prompt_embeds, input_ids)")->required();
  cmd->add_flag("--print-ids", args->print_ids, "Print the prompt's token ids as a JSON array");
  cmd->callback([args, &action, prompt, prompt_file, cmd] {
    if (prompt->count() == 0 && prompt_file->count() == 0) {
      throw CLI::ValidationError(cmd->get_name(), "one of --prompt or --prompt-file is required");
    }
    action = [args] { return run_encode_text(*args); };
  });
}

}  // namespace vortex::cli
