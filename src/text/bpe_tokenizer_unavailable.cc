// The tokenizer of a build without ICU (the GPU machine's image lacks it): loading says so in one
// line, and no tokenizer object can exist, so the other members are never reached.
#include "text/bpe_tokenizer.h"

namespace vortex::text {

struct BpeTokenizer::Impl {};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

Result<BpeTokenizer> BpeTokenizer::load(const std::string& path) {
  return unimplemented(path + ": this build has no prompt tokenizer (ICU was not found when it was configured; "
                       "scripts/deps installs libicu-dev). Pass text states with --text instead");
}

Result<std::vector<int32_t>> BpeTokenizer::encode(std::string_view) const {
  return unimplemented("this build has no prompt tokenizer");
}

Result<int32_t> BpeTokenizer::token_id(std::string_view) const {
  return unimplemented("this build has no prompt tokenizer");
}

int64_t BpeTokenizer::id_limit() const { return 0; }

}  // namespace vortex::text
