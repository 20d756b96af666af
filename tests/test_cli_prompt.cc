// A prompt in, as a user gives it: `vortex encode-text`, `generate --prompt` and the served
// "prompt" field, on a synthetic Qwen3-VL text encoder whose hidden size is the test preset's
// text_dim (8) and whose vocabulary holds every Qwen id, with the committed trimmed tokenizer.
// A prompt's generation is the bits of `generate --text` on encode-text's output; the prompt's
// ids are Hugging Face's; refusals are one line and leave no output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "must.h"
#include "safetensors_test_util.h"
#include "serve_process.h"
#include "text/synthetic_qwen3.h"
#include "text/text_conditioner.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;
using test::golden_path;
using test::must;
using test_util::expect_one_line_error;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

// The golden's second prompt and the ids Hugging Face tokenizers gives it.
struct GoldenPrompt {
  std::string text;
  std::vector<int32_t> ids;
};
GoldenPrompt golden_prompt() {
  const auto golden = nlohmann::json::parse(test_util::read_bytes(golden_path("qwen_tokenizer_ids.json")));
  const auto& p = golden.at("prompts").at(1);
  return {p.at("text"), p.at("ids").get<std::vector<int32_t>>()};
}

std::string tokenizer_path() { return golden_path("qwen_tokenizer_trimmed.json"); }

// A two-layer Qwen3-VL text encoder of width `hidden` (text/synthetic_qwen3.h).
void write_text_encoder(const fs::path& dir, int64_t hidden, int64_t vocab) {
  text::SyntheticQwen3Shape shape;
  shape.hidden = hidden;
  shape.vocab = vocab;
  must(text::write_synthetic_qwen3(dir.string(), shape));
}

// Every Qwen3 id (the trimmed tokenizer's added tokens reach 151668).
constexpr int64_t kQwenVocab = 151936;

class CliPrompt : public ::testing::Test {
 protected:
  void SetUp() override { write_text_encoder(encoder_dir(), /*hidden=*/8, kQwenVocab); }
  fs::path encoder_dir() const { return tmp_.path() / "qwen3"; }
  std::string encoder_flags(int layer = 2) const {
    return "--text-encoder " + q(encoder_dir().string()) + " --tokenizer " + q(tokenizer_path()) +
           " --text-encoder-layer " + std::to_string(layer);
  }
  std::string generate_flags() const {
    return "generate --synthetic test --height 64 --width 64 --frames 22 --steps 3 --seed 5 ";
  }
  TempDir tmp_;
};

TEST_F(CliPrompt, EncodeTextWritesTheStatesGenerateTakes) {
  const GoldenPrompt prompt = golden_prompt();
  const std::string embeds = tmp_.file("embeds.safetensors");
  const auto encoded = run_cli("encode-text " + encoder_flags() + " --prompt " + q(prompt.text) + " --out " +
                               q(embeds) + " --print-ids");
  ASSERT_EQ(encoded.code, 0) << encoded.err;
  const auto printed = nlohmann::json::parse(encoded.out.substr(0, encoded.out.find('\n')));
  EXPECT_EQ(printed.get<std::vector<int32_t>>(), prompt.ids);

  // The file holds what the library computes, and the ids.
  const SafetensorsFile file = must(SafetensorsFile::open(embeds));
  const Tensor states = must(file.get("prompt_embeds"));
  const int64_t n = static_cast<int64_t>(prompt.ids.size());
  EXPECT_EQ(states.shape(), Shape({n, 8}));
  EXPECT_EQ(states.dtype(), DType::kBF16);
  const Tensor ids = must(file.get("input_ids"));
  ASSERT_EQ(ids.numel(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(element_as_double(ids, i), prompt.ids[i]);
  const auto conditioner = must(text::TextConditioner::load({encoder_dir().string(), tokenizer_path(), 2}));
  const Tensor want = must(conditioner->encode(prompt.ids));
  EXPECT_EQ(std::memcmp(states.data(), want.data(), want.nbytes()), 0);

  // The same prompt given to generate: the bits generate --text writes for encode-text's file.
  const auto from_prompt =
      run_cli(generate_flags() + encoder_flags() + " --prompt " + q(prompt.text) + " --out " + q(tmp_.file("a")));
  ASSERT_EQ(from_prompt.code, 0) << from_prompt.err;
  EXPECT_NE(from_prompt.err.find("encoding the prompt: 22 tokens"), std::string::npos) << from_prompt.err;
  const auto from_file = run_cli(generate_flags() + "--text " + q(embeds) + " --out " + q(tmp_.file("b")));
  ASSERT_EQ(from_file.code, 0) << from_file.err;
  const auto a = nlohmann::json::parse(test_util::read_bytes(tmp_.file("a.json")));
  const auto b = nlohmann::json::parse(test_util::read_bytes(tmp_.file("b.json")));
  EXPECT_EQ(a["checksums"], b["checksums"]);
  EXPECT_EQ(a["request"]["prompt"], prompt.text);
  EXPECT_EQ(a["request"]["prompt_tokens"].get<std::vector<int32_t>>(), prompt.ids);
  EXPECT_EQ(a["request"]["text_tokens"], n);
  EXPECT_NE(a["text_encoder"].get<std::string>().find("layer 2"), std::string::npos) << a["text_encoder"];

  // A deeper layer is another conditioning.
  const auto layer1 =
      run_cli(generate_flags() + encoder_flags(1) + " --prompt " + q(prompt.text) + " --out " + q(tmp_.file("c")));
  ASSERT_EQ(layer1.code, 0) << layer1.err;
  const auto c = nlohmann::json::parse(test_util::read_bytes(tmp_.file("c.json")));
  EXPECT_NE(a["checksums"], c["checksums"]);
}

TEST_F(CliPrompt, RefusalsAreOneLineAndWriteNothing) {
  const std::string out = tmp_.file("out");
  const std::string to_out = " --out " + q(out);
  expect_one_line_error(run_cli(generate_flags() + "--prompt 'a fox'" + to_out),
                        "prompt: this model has no text encoder (start it with --text-encoder)");
  expect_one_line_error(run_cli(generate_flags() + "--tokenizer " + q(tokenizer_path()) + " --text-tokens 3" + to_out),
                        "--tokenizer is for --text-encoder");
  expect_one_line_error(run_cli(generate_flags() + encoder_flags() + " --prompt ''" + to_out), "prompt: empty");
  expect_one_line_error(run_cli(generate_flags() + encoder_flags() + " --prompt \"$(printf 'ab\\377c')\"" + to_out),
                        "prompt: invalid UTF-8 at byte offset 2");
  expect_one_line_error(run_cli(generate_flags() + encoder_flags(3) + " --prompt 'a fox'" + to_out),
                        "text encoder layer 3 is outside 1..2");
  // --prompt with other text states: CLI11 refuses the pair before anything runs.
  const auto both = run_cli(generate_flags() + encoder_flags() + " --prompt 'a fox' --text-tokens 3" + to_out);
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;

  // An encoder of another width, and one whose vocabulary the tokenizer's ids overrun.
  const fs::path wide = tmp_.path() / "wide", small_vocab = tmp_.path() / "small_vocab";
  write_text_encoder(wide, /*hidden=*/16, kQwenVocab);
  write_text_encoder(small_vocab, /*hidden=*/8, /*vocab=*/1000);
  const std::string tok = " --tokenizer " + q(tokenizer_path()) + " --text-encoder-layer 2 --prompt 'a red fox'";
  expect_one_line_error(run_cli(generate_flags() + "--text-encoder " + q(wide.string()) + tok + to_out),
                        "its hidden size 16 is not the transformer's text_dim 8");
  expect_one_line_error(run_cli(generate_flags() + "--text-encoder " + q(small_vocab.string()) + tok + to_out),
                        "outside the text encoder's vocabulary of 1000");
  expect_one_line_error(run_cli("encode-text --text-encoder " + q(small_vocab.string()) + tok + to_out),
                        "outside the text encoder's vocabulary of 1000");
  // No tokenizer.json beside the encoder and none given.
  expect_one_line_error(run_cli(generate_flags() + "--text-encoder " + q(encoder_dir().string()) +
                                " --text-encoder-layer 2 --prompt 'a fox'" + to_out),
                        "tokenizer.json");
  for (const char* ext : {".safetensors", ".json"}) EXPECT_FALSE(fs::exists(out + ext)) << ext;

  // The encoder on a device this machine lacks (CI's has none; a GPU machine runs it in the GPU suite).
  if (!fs::exists("/dev/nvidia0")) {
    const std::string embeds = tmp_.file("embeds.safetensors");
    const auto refused = run_cli("encode-text --device cuda " + encoder_flags() + " --prompt 'a fox' --out " + q(embeds));
    EXPECT_EQ(refused.code, 1) << refused.err;  // unimplemented here: the request is valid, the machine lacks the device
    EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
    EXPECT_NE(refused.err.find("the text encoder on cuda"), std::string::npos) << refused.err;
    EXPECT_FALSE(fs::exists(embeds));
  }
}

#if defined(VORTEX_HAVE_SERVICE)
TEST_F(CliPrompt, AServedPromptIsTheBitsGenerateWrites) {
  using test_util::expect_bad_request;
  using test_util::json_of;
  using test_util::post_json;
  using test_util::wait_for_state;
  const GoldenPrompt prompt = golden_prompt();
  test_util::ServeProcess server({"--text-encoder", encoder_dir().string(), "--tokenizer", tokenizer_path(),
                                  "--text-encoder-layer", "2"});
  httplib::Client c = server.client();
  const nlohmann::json request = {{"prompt", prompt.text}, {"height", 64}, {"width", 64},
                                  {"frames", 22},          {"steps", 3},   {"seed", 5}};
  const httplib::Result submitted = post_json(c, request.dump());
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  const nlohmann::json done = wait_for_state(c, json_of(submitted).at("id"), "succeeded");
  const auto generated =
      run_cli(generate_flags() + encoder_flags() + " --prompt " + q(prompt.text) + " --out " + q(tmp_.file("g")));
  ASSERT_EQ(generated.code, 0) << generated.err;
  const auto want = nlohmann::json::parse(test_util::read_bytes(tmp_.file("g.json")));
  EXPECT_EQ(done["result"]["checksums"], want["checksums"]);
  EXPECT_EQ(done["result"]["request"]["prompt_tokens"].get<std::vector<int32_t>>(), prompt.ids);

  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": ""})", "prompt: empty"},
      {R"({"prompt": 5})", "prompt: a string is expected"},
      {R"({"prompt": "a fox", "text_tokens": 3})", "text_tokens: synthetic text states, but a prompt came too"},
  };
  for (const auto& [body, needle] : cases) expect_bad_request(c, body, needle);
  EXPECT_EQ(server.stop(), 0) << server.log();

  // A server without a text encoder refuses prompts with a 400 that says how to start it.
  test_util::ServeProcess plain;
  httplib::Client p = plain.client();
  const httplib::Result refused = post_json(p, R"({"prompt": "a fox", "height": 64, "width": 64, "frames": 22})");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_NE(json_of(refused).value("error", "").find("--text-encoder"), std::string::npos) << refused->body;
  EXPECT_EQ(plain.stop(), 0) << plain.log();
}
#endif  // VORTEX_HAVE_SERVICE

}  // namespace
}  // namespace vortex
