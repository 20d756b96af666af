// Status and Result<T>: how every library function reports failure.
//
// Library code never exits or throws across the API: it returns a Status whose message is one
// line naming the tensor, field or byte offset at fault, so that the CLI can print it as is and
// the service can return it as a 4xx body.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace vortex {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's request is malformed (bad shape, bad option, NaN input)
  kNotFound,         // a file or tensor that should exist does not
  kIoError,          // the operating system refused a read or write
  kCorruptData,      // a file exists but its bytes do not describe what they claim to
  kUnimplemented,    // a valid request this build cannot serve (no CUDA, unsupported dtype)
  kOutOfMemory,
  kDeviceError,      // CUDA / cuBLAS / NCCL reported an error
  kCancelled,        // the caller asked the work to stop (a served job cancelled between steps)
  kInternal,         // a broken invariant inside vortex: a bug
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>"
  std::string to_string() const;

  // Prefixes the message with more context, e.g. the file a tensor was read from.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status corrupt_data(std::string m) { return {StatusCode::kCorruptData, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status out_of_memory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
inline Status device_error(std::string m) { return {StatusCode::kDeviceError, std::move(m)}; }
inline Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status explaining why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(state_);
  }
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace vortex

#define VORTEX_CONCAT_INNER(a, b) a##b
#define VORTEX_CONCAT(a, b) VORTEX_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` fails.
#define VORTEX_RETURN_IF_ERROR(expr)               \
  do {                                             \
    ::vortex::Status vortex_status_ = (expr);      \
    if (!vortex_status_.ok()) return vortex_status_; \
  } while (0)

// `VORTEX_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define VORTEX_ASSIGN_OR_RETURN(lhs, expr) \
  VORTEX_ASSIGN_OR_RETURN_IMPL(VORTEX_CONCAT(vortex_result_, __LINE__), lhs, expr)
#define VORTEX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
