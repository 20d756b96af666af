// Failure as exceptions for test code: must() returns a Result's value or throws
// std::runtime_error with the Status message, which gtest reports as the test's failure. Keeps the
// tests free of error plumbing. (Library code never throws; tests may.)
#pragma once

#include <stdexcept>
#include <utility>

#include "vortex/status.h"

namespace vortex::test {

inline void must(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.to_string());
}
template <class T>
T must(Result<T> result) {
  if (!result.ok()) throw std::runtime_error(result.status().to_string());
  return std::move(result).value();
}

}  // namespace vortex::test
