// SHA-256 (FIPS 180-4): trajectory checksums and run-manifest digests (DESIGN sections 3 and 4).
// Our own because the GPU image has no OpenSSL headers and DESIGN section 6 allows no vendoring.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace vortex {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hashing: update() any number of times with any split of the message, then finish().
// finish() leaves the state alone, so a running hash can report its digest so far and go on.
class Sha256 {
 public:
  Sha256();

  void update(const void* data, size_t size);
  Sha256Digest finish() const;
  // finish() as 64 lowercase hex digits.
  std::string finish_hex() const;

 private:
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};  // the incomplete tail block
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lowercase hex, two digits per byte.
std::string to_hex(const Sha256Digest& digest);

Sha256Digest sha256(const void* data, size_t size);
std::string sha256_hex(const void* data, size_t size);

}  // namespace vortex
