// quote(): how untrusted names appear in error messages (one line, bounded, valid UTF-8); and the
// UTF-8 well-formedness check under it (core/utf8.h).
#include "core/quote.h"

#include <gtest/gtest.h>

#include <string>

#include "core/utf8.h"

namespace vortex {
namespace {

TEST(Quote, PlainTextIsQuotedAsIs) {
  EXPECT_EQ(quote("model.layers.0.weight"), "'model.layers.0.weight'");
  EXPECT_EQ(quote(""), "''");
  EXPECT_EQ(quote("caf\xC3\xA9 \xE6\x97\xA5 \xF0\x9F\x8E\xB5"), "'caf\xC3\xA9 \xE6\x97\xA5 \xF0\x9F\x8E\xB5'");
}

TEST(Quote, ControlBytesAndInvalidUtf8AreEscaped) {
  EXPECT_EQ(quote(std::string("a\nb\0c\x7F", 6)), "'a\\x0Ab\\x00c\\x7F'");
  EXPECT_EQ(quote("\xFF\xFE"), "'\\xFF\\xFE'");                  // never UTF-8
  EXPECT_EQ(quote("x\x80y"), "'x\\x80y'");                       // a stray continuation byte
  EXPECT_EQ(quote("\xC0\xAF"), "'\\xC0\\xAF'");                  // an overlong '/'
  EXPECT_EQ(quote("\xED\xA0\x80"), "'\\xED\\xA0\\x80'");         // a surrogate
  EXPECT_EQ(quote("\xF4\x90\x80\x80"), "'\\xF4\\x90\\x80\\x80'");  // past U+10FFFF
  EXPECT_EQ(quote("\xE6\x97"), "'\\xE6\\x97'");                  // cut short at the end
}

TEST(Quote, LongTextIsShortenedAtACharacterBoundary) {
  const std::string ascii(500, 'n');
  EXPECT_EQ(quote(ascii), "'" + std::string(160, 'n') + "' (500 bytes, shortened)");
  // 159 ASCII bytes then a 3-byte character that would cross the 160-byte limit: left out whole.
  const std::string text = std::string(159, 'a') + "\xE6\x97\xA5" + "tail";
  EXPECT_EQ(quote(text), "'" + std::string(159, 'a') + "' (166 bytes, shortened)");
}

TEST(Utf8, FirstInvalidByteIsFound) {
  EXPECT_EQ(first_invalid_utf8(""), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("plain caf\xC3\xA9 \xF0\x9F\x8E\xB5"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("ab\xC3"), 2u);              // cut short
  EXPECT_EQ(first_invalid_utf8("a\xE0\x80\x80"), 1u);      // overlong 3-byte form
  EXPECT_EQ(first_invalid_utf8("\xEF\xBF\xBF\xED\xBF\xBF"), 3u);  // U+FFFF fine, then a surrogate
  EXPECT_EQ(first_invalid_utf8("\xF4\x8F\xBF\xBF\xF5"), 4u);  // U+10FFFF fine, then no lead byte
}

}  // namespace
}  // namespace vortex
