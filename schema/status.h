// Errors as values for every tether module boundary.
//
// A Status is either OK or carries an error code and a human message that
// names what went wrong (the file, flag, peer or tensor concerned).
// Result<T> is a T or a non-OK Status. Both are cheap to move and are not
// thread-safe to mutate concurrently (like any value type).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace tether {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // a bad flag, option or API argument
  kBadFrame,         // malformed bytes from the network
  kFrameTooLarge,
  kVersionMismatch,
  kProtocol,  // a well-formed message out of place
  kNotFound,  // unknown tensor, table, file
  kShapeMismatch,
  kStalePush,
  kUnavailable,  // peer unreachable, connection closed, shutting down
  kTimeout,
  kIoError,
  kInternal,
  kAuthFailed,  // no key, a wrong key or a replayed handshake
  kCancelled,   // the run was stopped
  kNonFinite,   // NaN or Inf where numbers must be finite
  kNotReady,    // a provided tensor's values are not written yet
  kCorruption,  // stored data (a checkpoint) that does not decode or whose
                // checksum does not match
};

// A short lowercase name for `code`, e.g. "invalid argument".
const char* CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "ok", or "<code name>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is prefixed by `context` and ": ".
  Status WithContext(const std::string& context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {Code::kInvalidArgument, std::move(m)};
}
inline Status Unavailable(std::string m) {
  return {Code::kUnavailable, std::move(m)};
}
inline Status BadFrame(std::string m) {
  return {Code::kBadFrame, std::move(m)};
}
inline Status ProtocolError(std::string m) {
  return {Code::kProtocol, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {Code::kNotFound, std::move(m)};
}
inline Status Corruption(std::string m) {
  return {Code::kCorruption, std::move(m)};
}
inline Status Internal(std::string m) {
  return {Code::kInternal, std::move(m)};
}

// A value or an error. Constructing from an OK Status is a programming error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok());
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace tether

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define TETHER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::tether::Status tether_status_ = (expr);        \
    if (!tether_status_.ok()) return tether_status_; \
  } while (0)

// Evaluates `expr` (a Result<T>). When it is not OK, returns its Status from
// the enclosing function (which returns a Status or any Result<U>); otherwise
// moves the value into `lhs`, which may declare a variable (`auto x`,
// `Foo x`, `const Foo& x`) or name an existing one:
//
//   TETHER_ASSIGN_OR_RETURN(auto store, CheckpointStore::Open(dir, mode));
//   TETHER_ASSIGN_OR_RETURN(header, ReadHeader(file));
//
// It expands to several statements in the enclosing scope, so it cannot be
// the whole body of an unbraced if/else or loop. `lhs` must not contain a
// bare comma (write `auto p`, not `std::pair<int, int> p`); `expr` may.
#define TETHER_ASSIGN_OR_RETURN(lhs, ...) \
  TETHER_ASSIGN_OR_RETURN_IMPL_(          \
      TETHER_STATUS_CONCAT_(tether_result_, __COUNTER__), lhs, __VA_ARGS__)

// Implementation details of TETHER_ASSIGN_OR_RETURN.
#define TETHER_ASSIGN_OR_RETURN_IMPL_(result, lhs, ...) \
  auto result = (__VA_ARGS__);                          \
  if (!result.ok()) return result.status();             \
  lhs = std::move(result).value()
#define TETHER_STATUS_CONCAT_(a, b) TETHER_STATUS_CONCAT_INNER_(a, b)
#define TETHER_STATUS_CONCAT_INNER_(a, b) a##b
