#include "schema/frame.h"

#include <cstring>

namespace tether {

Frame::Frame(uint32_t body_size)
    : bytes_(AllocatePooled(kFrameHeaderBytes + body_size)),
      size_(kFrameHeaderBytes + body_size) {
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    bytes_[i] = static_cast<uint8_t>(body_size >> (8 * i));
  }
}

Frame Frame::Adopt(PooledBuilder& fbb) {
  const size_t size = fbb.GetSize();
  size_t allocated = 0;
  size_t offset = 0;
  Frame frame;
  // The builder's buffer came from BufferPool::Default() through
  // PooledAllocator, with `allocated` bytes: Release gives it back so.
  frame.bytes_ =
      PooledBytes(fbb.ReleaseRaw(allocated, offset), PooledRelease{allocated});
  frame.offset_ = offset;
  frame.size_ = size;
  return frame;
}

namespace {

// FlatBuffers 2.0's verifier checks a vector's length field but not that
// 8-byte elements are 8-byte aligned; reading a misaligned one is undefined
// behaviour (found by tools/fuzz). Builders always align them, so only a
// hostile peer sends one.
template <typename T>
bool Aligned(const flatbuffers::Vector<T>* v) {
  // An empty vector has no element to misread (builders may leave it
  // unaligned).
  return v == nullptr || v->size() == 0 ||
         reinterpret_cast<uintptr_t>(v->data()) % alignof(T) == 0;
}

Status CheckWideVectors(const wire::Message& m) {
  bool aligned = true;
  if (const auto* d = m.body_as_DefineTensor()) aligned = Aligned(d->shape());
  if (const auto* p = m.body_as_Pull()) aligned = Aligned(p->keys());
  if (const auto* p = m.body_as_Push()) aligned = Aligned(p->keys());
  if (const auto* r = m.body_as_ResumeResult()) aligned = Aligned(r->intact());
  if (const auto* s = m.body_as_Stats()) {
    aligned = Aligned(s->staleness_histogram());
  }
  if (!aligned) return BadFrame("misaligned 8-byte vector in the message");
  return Status::Ok();
}

}  // namespace

Status Frame::Verify() const {
  if (bytes_ == nullptr || body_size() < kMinFrameBodyBytes) {
    return BadFrame("frame body of " + std::to_string(body_size()) +
                    " bytes is too short to hold a message");
  }
  if (!wire::SizePrefixedMessageBufferHasIdentifier(data())) {
    std::string got(
        reinterpret_cast<const char*>(data()) + kFrameHeaderBytes + 4, 4);
    for (char& c : got) {
      if (c < 32 || c > 126) c = '?';
    }
    return BadFrame("wrong file identifier '" + got + "' (expected '" +
                    wire::MessageIdentifier() + "')");
  }
  flatbuffers::Verifier verifier(data(), size_, /*max_depth=*/64,
                                 /*max_tables=*/1 << 20);
  if (!wire::VerifySizePrefixedMessageBuffer(verifier)) {
    return BadFrame("frame failed FlatBuffers verification");
  }
  // The verifier also accepts a union whose type is set but whose value
  // is missing; every handler reads the body its type names.
  if (message()->body_type() == wire::Body::NONE ||
      message()->body() == nullptr) {
    return BadFrame("message has no body");
  }
  return CheckWideVectors(*message());
}

Result<uint32_t> ParseFrameHeader(const uint8_t header[kFrameHeaderBytes],
                                  size_t max_frame_bytes) {
  uint32_t n = 0;
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    n |= static_cast<uint32_t>(header[i]) << (8 * i);
  }
  if (n > max_frame_bytes) {
    return Status(Code::kFrameTooLarge, "frame of " + std::to_string(n) +
                                            " bytes exceeds the limit of " +
                                            std::to_string(max_frame_bytes) +
                                            " bytes");
  }
  if (n < kMinFrameBodyBytes) {
    return BadFrame("frame length " + std::to_string(n) +
                    " is too short to hold a message");
  }
  return n;
}

std::vector<uint8_t> OutBuffer::Flatten() const {
  std::vector<uint8_t> out;
  out.reserve(size());
  ForEachPiece(
      [&out](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
  return out;
}

OutFrame FinishFrame(flatbuffers::FlatBufferBuilder& fbb, wire::Body type,
                     flatbuffers::Offset<void> body) {
  auto message = wire::CreateMessage(fbb, type, body);
  wire::FinishSizePrefixedMessageBuffer(fbb, message);
  return std::make_shared<const OutBuffer>(
      fbb.Release(), std::vector<OutBuffer::Splice>{},
      std::vector<std::shared_ptr<const void>>{});
}

flatbuffers::Offset<flatbuffers::Vector<float>> FrameSplicer::AddFloats(
    std::span<const float> values, std::shared_ptr<const void> owner) {
  float* reserved = nullptr;
  auto offset = fbb_.CreateUninitializedVector(values.size(), &reserved);
  // The builder grows toward the front, so a distance from the end stays
  // valid through later growth and Finish.
  const uint8_t* end = fbb_.GetCurrentBufferPointer() + fbb_.GetSize();
  pending_.push_back(
      {static_cast<size_t>(end - reinterpret_cast<const uint8_t*>(reserved)),
       reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()});
  if (owner) owners_.push_back(std::move(owner));
  return offset;
}

OutFrame FrameSplicer::Finish(wire::Body type, flatbuffers::Offset<void> body) {
  auto message = wire::CreateMessage(fbb_, type, body);
  wire::FinishSizePrefixedMessageBuffer(fbb_, message);
  flatbuffers::DetachedBuffer buffer = fbb_.Release();
  std::vector<OutBuffer::Splice> splices;
  splices.reserve(pending_.size());
  // Created front to back in call order, so they lie back to front.
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    if (it->size == 0) continue;
    splices.push_back({buffer.size() - it->from_end, it->data, it->size});
  }
  pending_.clear();
  return std::make_shared<const OutBuffer>(
      std::move(buffer), std::move(splices), std::move(owners_));
}

wire::ErrorCode ToWireCode(Code code) {
  switch (code) {
    case Code::kOk:
      return wire::ErrorCode::None;
    case Code::kBadFrame:
      return wire::ErrorCode::BadFrame;
    case Code::kFrameTooLarge:
      return wire::ErrorCode::FrameTooLarge;
    case Code::kVersionMismatch:
      return wire::ErrorCode::VersionMismatch;
    case Code::kProtocol:
      return wire::ErrorCode::Protocol;
    case Code::kTimeout:
      return wire::ErrorCode::Timeout;
    case Code::kIoError:
      return wire::ErrorCode::IoError;
    case Code::kInvalidArgument:
      return wire::ErrorCode::BadRequest;
    case Code::kNotFound:
      return wire::ErrorCode::UnknownTensor;
    case Code::kShapeMismatch:
      return wire::ErrorCode::ShapeMismatch;
    case Code::kStalePush:
      return wire::ErrorCode::StalePush;
    case Code::kUnavailable:
      return wire::ErrorCode::Unavailable;
    case Code::kAuthFailed:
      return wire::ErrorCode::AuthFailed;
    case Code::kNonFinite:
      return wire::ErrorCode::NonFinite;
    case Code::kNotReady:
      return wire::ErrorCode::NotReady;
    case Code::kCorruption:
      return wire::ErrorCode::Corruption;
    default:
      return wire::ErrorCode::Internal;
  }
}

Code FromWireCode(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::None:
      return Code::kOk;
    case wire::ErrorCode::BadFrame:
      return Code::kBadFrame;
    case wire::ErrorCode::FrameTooLarge:
      return Code::kFrameTooLarge;
    case wire::ErrorCode::VersionMismatch:
      return Code::kVersionMismatch;
    case wire::ErrorCode::AuthFailed:
      return Code::kAuthFailed;
    case wire::ErrorCode::HelloRequired:
    case wire::ErrorCode::Protocol:
      return Code::kProtocol;
    case wire::ErrorCode::Timeout:
      return Code::kTimeout;
    case wire::ErrorCode::IoError:
      return Code::kIoError;
    case wire::ErrorCode::BadRequest:
      return Code::kInvalidArgument;
    case wire::ErrorCode::UnknownTensor:
      return Code::kNotFound;
    case wire::ErrorCode::ShapeMismatch:
      return Code::kShapeMismatch;
    case wire::ErrorCode::StalePush:
      return Code::kStalePush;
    case wire::ErrorCode::Unavailable:
      return Code::kUnavailable;
    case wire::ErrorCode::NonFinite:
      return Code::kNonFinite;
    case wire::ErrorCode::NotReady:
      return Code::kNotReady;
    case wire::ErrorCode::Corruption:
      return Code::kCorruption;
    default:
      return Code::kInternal;
  }
}

OutFrame MakeErrorFrame(uint64_t request_id, const Status& status) {
  return MakeErrorFrame(request_id, ToWireCode(status.code()),
                        status.message());
}

OutFrame MakeErrorFrame(uint64_t request_id, wire::ErrorCode code,
                        const std::string& message) {
  flatbuffers::FlatBufferBuilder fbb(256 + message.size());
  auto text = fbb.CreateString(message);
  return FinishFrame(fbb, wire::CreateError(fbb, request_id, code, text));
}

Status StatusFromError(const wire::Error& error, const std::string& peer) {
  Code code = FromWireCode(error.code());
  if (code == Code::kOk) code = Code::kInternal;
  std::string text = error.message() ? error.message()->str() : "no message";
  return Status(code, peer + ": " + text);
}

}  // namespace tether
