// SHA-256 against the FIPS 180-4 example vectors, padding-boundary lengths, and split updates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/sha256.h"

namespace vortex {
namespace {

std::string hex_of(const std::string& message) { return sha256_hex(message.data(), message.size()); }

TEST(Sha256, NistVectors) {
  EXPECT_EQ(hex_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
                   "lmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(hex_of(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex(nullptr, 0), hex_of(""));
}

// Lengths around the padding boundaries: 55 bytes still fit the length in one final block, 56 do
// not. Expected digests from Python's hashlib.
TEST(Sha256, PaddingBoundaries) {
  const std::pair<size_t, const char*> cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (const auto& [size, want] : cases) EXPECT_EQ(hex_of(std::string(size, 'a')), want) << size;
  std::vector<uint8_t> bytes(1024);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(sha256_hex(bytes.data(), bytes.size()),
            "785b0751fc2c53dc14a4ce3d800e69ef9ce1009eb327ccf458afe09c242c26c9");
}

TEST(Sha256, SplitUpdatesEqualOneShot) {
  std::mt19937 rng(11);
  std::vector<uint8_t> message(3000);
  for (auto& b : message) b = static_cast<uint8_t>(rng());
  for (size_t length : {0, 1, 63, 64, 65, 128, 3000}) {
    const std::string want = sha256_hex(message.data(), length);
    for (size_t chunk : {1, 3, 55, 64, 65, 1000}) {
      Sha256 h;
      for (size_t off = 0; off < length; off += chunk) {
        h.update(message.data() + off, std::min(chunk, length - off));
      }
      EXPECT_EQ(h.finish_hex(), want) << "length " << length << " chunk " << chunk;
    }
    // Random cut points, including empty pieces.
    for (int trial = 0; trial < 20; ++trial) {
      Sha256 h;
      size_t off = 0;
      while (off < length) {
        const size_t piece = std::min<size_t>(rng() % 150, length - off);
        h.update(message.data() + off, piece);
        off += piece;
      }
      EXPECT_EQ(h.finish_hex(), want) << "length " << length << " trial " << trial;
    }
  }
}

TEST(Sha256, FinishDoesNotEndTheHash) {
  Sha256 h;
  h.update("ab", 2);
  EXPECT_EQ(h.finish_hex(), hex_of("ab"));
  EXPECT_EQ(h.finish_hex(), hex_of("ab"));
  h.update("c", 1);
  EXPECT_EQ(h.finish_hex(), hex_of("abc"));
  EXPECT_EQ(to_hex(h.finish()), h.finish_hex());
  EXPECT_EQ(sha256(std::string("abc").data(), 3), h.finish());
}

}  // namespace
}  // namespace vortex
