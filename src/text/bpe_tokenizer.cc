#include "text/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include "core/utf8.h"

namespace vortex::text {
namespace {

using nlohmann::json;

// GPT-2's byte-level alphabet as UTF-8: printable Latin-1 bytes stand for themselves, the other 68
// bytes take the code points from U+0100 up, in byte order.
std::array<std::string, 256> byte_level_alphabet() {
  std::array<std::string, 256> table;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    const uint32_t cp = printable ? b : next++;
    std::string utf8;
    if (cp < 0x80) {
      utf8.push_back(static_cast<char>(cp));
    } else {  // every code point here is below U+0800: two bytes
      utf8.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
    table[b] = utf8;
  }
  return table;
}

// A field's value or an error naming it.
Result<const json*> field(const json& parent, const std::string& key, const std::string& where) {
  if (!parent.is_object() || !parent.contains(key)) return corrupt_data(where + ": no field '" + key + "'");
  return &parent.at(key);
}

Status expect_false(const json& parent, const std::string& key, const std::string& where) {
  if (parent.contains(key) && !parent.at(key).is_null() && parent.at(key) != false) {
    return unimplemented(where + "." + key + " is set; this tokenizer supports it off only");
  }
  return ok_status();
}

Status expect_empty_string(const json& parent, const std::string& key, const std::string& where) {
  if (parent.contains(key) && !parent.at(key).is_null() && parent.at(key) != "") {
    return unimplemented(where + "." + key + " is " + parent.at(key).dump() + "; this tokenizer supports \"\" only");
  }
  return ok_status();
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
};

struct MergeResult {
  int32_t rank = 0;
  int32_t merged = 0;
};

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

struct BpeTokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, MergeResult> merges;
  std::array<int32_t, 256> byte_ids{};
  std::array<std::string, 256> byte_chars = byte_level_alphabet();
  std::vector<AddedToken> added;  // longest first, so the first match at a position is the longest
  bool nfc = false;
  std::unique_ptr<icu::RegexPattern> split;
  int64_t id_limit = 0;

  Status load_model(const json& model, const std::string& where);
  Status load_normalizer(const json& root, const std::string& where);
  Status load_pre_tokenizer(const json& root, const std::string& where);
  Status load_added_tokens(const json& root, const std::string& where);

  // Appends the ids of one span with no added token in it.
  Status encode_span(std::string_view span, std::vector<int32_t>& ids) const;
  void encode_piece(const std::string& piece_utf8, std::vector<int32_t>& ids) const;
};

Status BpeTokenizer::Impl::load_model(const json& model, const std::string& where) {
  const std::string at = where + ": model";
  VORTEX_ASSIGN_OR_RETURN(const json* type, field(model, "type", at));
  if (*type != "BPE") return unimplemented(at + ".type is " + type->dump() + "; only BPE is supported");
  if (model.contains("dropout") && !model["dropout"].is_null()) return unimplemented(at + ".dropout is set");
  VORTEX_RETURN_IF_ERROR(expect_false(model, "byte_fallback", at));
  VORTEX_RETURN_IF_ERROR(expect_false(model, "ignore_merges", at));
  VORTEX_RETURN_IF_ERROR(expect_empty_string(model, "continuing_subword_prefix", at));
  VORTEX_RETURN_IF_ERROR(expect_empty_string(model, "end_of_word_suffix", at));

  VORTEX_ASSIGN_OR_RETURN(const json* vocab_json, field(model, "vocab", at));
  if (!vocab_json->is_object()) return corrupt_data(at + ".vocab is not an object");
  vocab.reserve(vocab_json->size());
  for (const auto& [token, id] : vocab_json->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return corrupt_data(at + ".vocab[" + json(token).dump() + "] is not a non-negative 32-bit id");
    }
    vocab.emplace(token, id.get<int32_t>());
    id_limit = std::max<int64_t>(id_limit, id.get<int64_t>() + 1);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_chars[b]);
    if (it == vocab.end()) {
      return corrupt_data(at + ".vocab lacks the byte-level symbol of byte " + std::to_string(b) +
                          " (a byte-level BPE needs all 256)");
    }
    byte_ids[b] = it->second;
  }

  VORTEX_ASSIGN_OR_RETURN(const json* merges_json, field(model, "merges", at));
  if (!merges_json->is_array()) return corrupt_data(at + ".merges is not an array");
  merges.reserve(merges_json->size());
  for (size_t rank = 0; rank < merges_json->size(); ++rank) {
    const json& m = (*merges_json)[rank];
    const std::string name = at + ".merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else if (m.is_string()) {  // the older "left right" spelling
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return corrupt_data(name + " is " + m.dump() + ", expected \"left right\"");
      }
      left = s.substr(0, space), right = s.substr(space + 1);
    } else {
      return corrupt_data(name + " is " + m.dump() + ", expected two strings");
    }
    auto l = vocab.find(left), r = vocab.find(right), merged = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || merged == vocab.end()) {
      return corrupt_data(name + " " + m.dump() + " names a symbol missing from the vocabulary");
    }
    // A repeated pair keeps its first (lowest) rank, as the Rust library's map does.
    merges.emplace(pair_key(l->second, r->second), MergeResult{static_cast<int32_t>(rank), merged->second});
  }
  return ok_status();
}

Status BpeTokenizer::Impl::load_normalizer(const json& root, const std::string& where) {
  if (!root.contains("normalizer") || root["normalizer"].is_null()) return ok_status();
  const json& n = root["normalizer"];
  if (!n.is_object() || n.value("type", "") != "NFC") {
    return unimplemented(where + ": normalizer " + n.dump() + " is not supported (null or NFC only)");
  }
  nfc = true;
  return ok_status();
}

Status BpeTokenizer::Impl::load_pre_tokenizer(const json& root, const std::string& where) {
  const std::string at = where + ": pre_tokenizer";
  VORTEX_ASSIGN_OR_RETURN(const json* pre, field(root, "pre_tokenizer", where));
  const bool sequence = pre->is_object() && pre->value("type", "") == "Sequence" && pre->contains("pretokenizers") &&
                        (*pre)["pretokenizers"].is_array() && (*pre)["pretokenizers"].size() == 2;
  if (!sequence) return unimplemented(at + " must be a Sequence of Split and ByteLevel");
  const json& split_json = (*pre)["pretokenizers"][0];
  const json& byte_level = (*pre)["pretokenizers"][1];
  if (split_json.value("type", "") != "Split" || split_json.value("behavior", "") != "Isolated" ||
      split_json.value("invert", true) != false || !split_json.contains("pattern") ||
      !split_json["pattern"].is_object() || !split_json["pattern"].contains("Regex") ||
      !split_json["pattern"]["Regex"].is_string()) {
    return unimplemented(at + ".pretokenizers[0] must be a Split by Regex, Isolated, not inverted");
  }
  if (byte_level.value("type", "") != "ByteLevel") return unimplemented(at + ".pretokenizers[1] must be ByteLevel");
  VORTEX_RETURN_IF_ERROR(expect_false(byte_level, "add_prefix_space", at + ".pretokenizers[1]"));
  VORTEX_RETURN_IF_ERROR(expect_false(byte_level, "use_regex", at + ".pretokenizers[1]"));

  const std::string pattern = split_json["pattern"]["Regex"].get<std::string>();
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error;
  split.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, parse_error, status));
  if (U_FAILURE(status)) {
    return corrupt_data(at + ".pretokenizers[0].pattern does not compile (" + u_errorName(status) + " at offset " +
                        std::to_string(parse_error.offset) + ")");
  }
  return ok_status();
}

Status BpeTokenizer::Impl::load_added_tokens(const json& root, const std::string& where) {
  if (!root.contains("added_tokens")) return ok_status();
  const json& list = root["added_tokens"];
  if (!list.is_array()) return corrupt_data(where + ": added_tokens is not an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + ": added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || t["content"].get<std::string>().empty() ||
        !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > INT32_MAX) {
      return corrupt_data(at + " needs a non-empty content and a non-negative 32-bit id");
    }
    for (const char* flag : {"lstrip", "rstrip", "single_word", "normalized"}) {
      VORTEX_RETURN_IF_ERROR(expect_false(t, flag, at));
    }
    added.push_back({t["content"].get<std::string>(), t["id"].get<int32_t>()});
    id_limit = std::max<int64_t>(id_limit, t["id"].get<int64_t>() + 1);
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  return ok_status();
}

void BpeTokenizer::Impl::encode_piece(const std::string& piece, std::vector<int32_t>& ids) const {
  // The symbols as a doubly linked list over the piece's bytes; a min-heap of candidate merges by
  // (rank, position) whose entries are checked when popped (a merge may have consumed either side).
  const int n = static_cast<int>(piece.size());
  std::vector<int32_t> symbol(n), prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    symbol[i] = byte_ids[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t left_symbol, right_symbol;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merges.find(pair_key(symbol[left], symbol[next[left]]));
    if (it != merges.end()) heap.push({it->second.rank, left, symbol[left], symbol[next[left]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (!alive[c.left] || right < 0 || symbol[c.left] != c.left_symbol || symbol[right] != c.right_symbol) continue;
    symbol[c.left] = merges.at(pair_key(c.left_symbol, c.right_symbol)).merged;
    alive[right] = false;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) ids.push_back(symbol[i]);
}

Status BpeTokenizer::Impl::encode_span(std::string_view span, std::vector<int32_t>& ids) const {
  if (span.empty()) return ok_status();
  UErrorCode status = U_ZERO_ERROR;
  icu::UnicodeString text = icu::UnicodeString::fromUTF8(icu::StringPiece(span.data(), static_cast<int32_t>(span.size())));
  if (nfc) {
    const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status)) return internal_error(std::string("ICU's NFC normalizer: ") + u_errorName(status));
    text = normalizer->normalize(text, status);
    if (U_FAILURE(status)) return internal_error(std::string("NFC normalization: ") + u_errorName(status));
  }
  std::unique_ptr<icu::RegexMatcher> matcher(split->matcher(text, status));
  if (U_FAILURE(status)) return internal_error(std::string("the pre-tokenizer's regex: ") + u_errorName(status));
  int32_t done = 0;  // UTF-16 offset of the text not yet cut into pieces
  std::string piece;
  auto emit = [&](int32_t begin, int32_t end) {
    if (end <= begin) return;
    piece.clear();
    text.tempSubStringBetween(begin, end).toUTF8String(piece);
    encode_piece(piece, ids);
  };
  while (matcher->find(status) && U_SUCCESS(status)) {
    const int32_t begin = matcher->start(status), end = matcher->end(status);
    if (end == begin) continue;  // empty matches cut nothing
    emit(done, begin);           // a gap the regex skipped is a piece of its own (Isolated)
    emit(begin, end);
    done = end;
  }
  if (U_FAILURE(status)) return internal_error(std::string("the pre-tokenizer's regex: ") + u_errorName(status));
  emit(done, text.length());
  return ok_status();
}

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

Result<BpeTokenizer> BpeTokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open the tokenizer file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  json root = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return corrupt_data(path + ": not a JSON object");

  BpeTokenizer tokenizer;
  tokenizer.impl_ = std::make_unique<Impl>();
  Impl& impl = *tokenizer.impl_;
  VORTEX_ASSIGN_OR_RETURN(const json* model, field(root, "model", path));
  VORTEX_RETURN_IF_ERROR(impl.load_model(*model, path));
  VORTEX_RETURN_IF_ERROR(impl.load_normalizer(root, path));
  VORTEX_RETURN_IF_ERROR(impl.load_pre_tokenizer(root, path));
  VORTEX_RETURN_IF_ERROR(impl.load_added_tokens(root, path));
  return tokenizer;
}

Result<std::vector<int32_t>> BpeTokenizer::encode(std::string_view text) const {
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    return invalid_argument("prompt: invalid UTF-8 at byte offset " + std::to_string(bad));
  }
  std::vector<int32_t> ids;
  size_t span_begin = 0, pos = 0;
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : impl_->added) {  // longest first
      if (text.compare(pos, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    VORTEX_RETURN_IF_ERROR(impl_->encode_span(text.substr(span_begin, pos - span_begin), ids));
    ids.push_back(hit->id);
    pos += hit->content.size();
    span_begin = pos;
  }
  VORTEX_RETURN_IF_ERROR(impl_->encode_span(text.substr(span_begin), ids));
  return ids;
}

Result<int32_t> BpeTokenizer::token_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added) {
    if (t.content == token) return t.id;
  }
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return not_found("the tokenizer has no token " + json(std::string(token)).dump());
  return it->second;
}

int64_t BpeTokenizer::id_limit() const { return impl_->id_limit; }

}  // namespace vortex::text
