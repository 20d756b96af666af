// The prompt tokenizer against Hugging Face `tokenizers` (ids made by
// tools/golden/make_qwen_tokenizer_golden.js on the Qwen3 tokenizer), and its errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "must.h"
#include "text/bpe_tokenizer.h"

namespace vortex::text {
namespace {

using test::must;

std::string golden(const std::string& rel) { return std::string(VORTEX_SOURCE_DIR) + "/tests/golden/" + rel; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

void expect_golden_ids(const BpeTokenizer& tokenizer) {
  const nlohmann::json g = read_json(golden("qwen_tokenizer_ids.json"));
  ASSERT_GE(g["prompts"].size(), 20u);
  for (const auto& p : g["prompts"]) {
    const std::string text = p["text"].get<std::string>();
    const auto ids = must(tokenizer.encode(text));
    EXPECT_EQ(ids, p["ids"].get<std::vector<int32_t>>()) << "prompt " << nlohmann::json(text).dump();
  }
}

// The trimmed file keeps every merge these prompts can use (see the golden script), so its ids are
// the full tokenizer's.
TEST(BpeTokenizer, TrimmedQwenTokenizerGivesTheReferenceIds) {
  const BpeTokenizer tokenizer = must(BpeTokenizer::load(golden("qwen_tokenizer_trimmed.json")));
  expect_golden_ids(tokenizer);
}

// The full Qwen3 tokenizer.json, where one is at hand (VORTEX_QWEN_TOKENIZER_JSON).
TEST(BpeTokenizer, FullQwenTokenizerGivesTheReferenceIds) {
  const char* path = std::getenv("VORTEX_QWEN_TOKENIZER_JSON");
  if (!path) GTEST_SKIP() << "set VORTEX_QWEN_TOKENIZER_JSON to a Qwen2/Qwen3 tokenizer.json to run this test";
  const BpeTokenizer tokenizer = must(BpeTokenizer::load(path));
  EXPECT_EQ(tokenizer.id_limit(), 151669);
  expect_golden_ids(tokenizer);
}

TEST(BpeTokenizer, NamesTokensAndRefusesUnknownOnes) {
  const BpeTokenizer tokenizer = must(BpeTokenizer::load(golden("qwen_tokenizer_trimmed.json")));
  EXPECT_EQ(must(tokenizer.token_id("<|image_pad|>")), 151655);
  EXPECT_EQ(must(tokenizer.token_id("<|vision_start|>")), 151652);
  EXPECT_EQ(must(tokenizer.token_id("A")), 32);
  const auto missing = tokenizer.token_id("<|no such token|>");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(BpeTokenizer, InvalidUtf8IsAnErrorNamingItsByteOffset) {
  const BpeTokenizer tokenizer = must(BpeTokenizer::load(golden("qwen_tokenizer_trimmed.json")));
  for (const auto& [text, offset] : std::vector<std::pair<std::string, int>>{
           {"ab\xff", 2}, {"caf\xc3", 3}, {"x\xc0\xafy", 1}, {"ok \xed\xa0\x80", 3}, {"\xf4\x90\x80\x80", 0}}) {
    const auto ids = tokenizer.encode(text);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("byte offset " + std::to_string(offset)), std::string::npos)
        << ids.status().message();
  }
}

// One pre-token of 50,000 bytes (no space or punctuation to cut it): the merge queue keeps this
// near-linear, where repeated scans for the best pair would take minutes.
TEST(BpeTokenizer, LongPiecesEncode) {
  const BpeTokenizer tokenizer = must(BpeTokenizer::load(golden("qwen_tokenizer_trimmed.json")));
  const auto ids = must(tokenizer.encode(std::string(50000, 'a')));
  EXPECT_GT(ids.size(), 0u);
  EXPECT_LE(ids.size(), 50000u);
}

// Each unsupported or broken setting is refused at load with the field named.
TEST(BpeTokenizer, RefusesFilesItCannotFollow) {
  const nlohmann::json base = read_json(golden("qwen_tokenizer_trimmed.json"));
  const std::string path = ::testing::TempDir() + "/bpe_tokenizer_case.json";
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    StatusCode code;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"unigram", [](nlohmann::json& j) { j["model"]["type"] = "Unigram"; }, StatusCode::kUnimplemented, "model.type"},
      {"byte fallback", [](nlohmann::json& j) { j["model"]["byte_fallback"] = true; }, StatusCode::kUnimplemented,
       "byte_fallback"},
      {"nfkc", [](nlohmann::json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, StatusCode::kUnimplemented, "normalizer"},
      {"prefix space",
       [](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       StatusCode::kUnimplemented, "add_prefix_space"},
      {"bad regex", [](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
       StatusCode::kCorruptData, "does not compile"},
      {"lstrip", [](nlohmann::json& j) { j["added_tokens"][0]["lstrip"] = true; }, StatusCode::kUnimplemented,
       "added_tokens[0].lstrip"},
      {"merge of unknown symbols", [](nlohmann::json& j) { j["model"]["merges"][5] = {"\xe2\x98\x83", "x"}; },
       StatusCode::kCorruptData, "merges[5]"},
      {"missing byte", [](nlohmann::json& j) { j["model"]["vocab"].erase("A"); }, StatusCode::kCorruptData,
       "byte 65"},
      {"no merges", [](nlohmann::json& j) { j["model"].erase("merges"); }, StatusCode::kCorruptData, "'merges'"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = base;
    c.edit(j);
    std::ofstream(path) << j.dump();
    const auto loaded = BpeTokenizer::load(path);
    ASSERT_FALSE(loaded.ok()) << c.name;
    EXPECT_EQ(loaded.status().code(), c.code) << c.name << ": " << loaded.status().message();
    EXPECT_NE(loaded.status().message().find(c.needle), std::string::npos) << c.name << ": " << loaded.status().message();
  }
  std::ofstream(path) << "{\"model\": [1, 2";
  EXPECT_EQ(BpeTokenizer::load(path).status().code(), StatusCode::kCorruptData);
  EXPECT_EQ(BpeTokenizer::load(path + ".absent").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace vortex::text
