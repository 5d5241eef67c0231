#include "schema/status.h"

namespace tether {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kBadFrame:
      return "bad frame";
    case Code::kFrameTooLarge:
      return "frame too large";
    case Code::kVersionMismatch:
      return "version mismatch";
    case Code::kProtocol:
      return "protocol error";
    case Code::kNotFound:
      return "not found";
    case Code::kShapeMismatch:
      return "shape mismatch";
    case Code::kStalePush:
      return "stale push";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kTimeout:
      return "timeout";
    case Code::kIoError:
      return "i/o error";
    case Code::kInternal:
      return "internal error";
    case Code::kAuthFailed:
      return "authentication failed";
    case Code::kCancelled:
      return "cancelled";
    case Code::kNonFinite:
      return "non-finite";
    case Code::kNotReady:
      return "not ready";
    case Code::kCorruption:
      return "corruption";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace tether
