// Framing shared by shards and clients: a 4-byte little-endian length, then
// one FlatBuffer (identifier "TTHR", root Message) of that many bytes.
// Frames are built with FlatBuffers' size-prefixed finish, so an outgoing
// frame is one contiguous buffer; received frames keep the prefix too, so
// in-buffer alignment matches the sender's and floats are read in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flatbuffers/flatbuffers.h"
#include "schema/buffer_pool.h"
#include "schema/status.h"
#include "schema/tether_generated.h"

namespace tether {

inline constexpr uint32_t kProtocolVersion = 2;  // 2: Pull.dtype
inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr size_t kDefaultMaxFrameBytes = size_t{64} << 20;
// A FlatBuffer is at least a root offset and the file identifier.
inline constexpr size_t kMinFrameBodyBytes = 8;

// A builder whose buffer, when large, comes from the BufferPool: what
// Frame::Adopt takes.
class PooledBuilder : public flatbuffers::FlatBufferBuilder {
 public:
  explicit PooledBuilder(size_t expected_bytes)
      : flatbuffers::FlatBufferBuilder(expected_bytes,
                                       &PooledAllocator::Instance()) {}
};

// A received frame: the header and body bytes, owned. Move-only.
class Frame {
 public:
  Frame() = default;
  // Allocates room for a body of `body_size` bytes (uninitialized) and
  // stores `body_size` as the header.
  explicit Frame(uint32_t body_size);

  // Takes the finished size-prefixed frame out of `fbb` without copying
  // it (its buffer came from the BufferPool, as a frame's does); `fbb` is
  // empty after. Verify() still decides whether it is a message.
  static Frame Adopt(PooledBuilder& fbb);

  uint8_t* body() { return bytes_.get() + offset_ + kFrameHeaderBytes; }
  const uint8_t* data() const { return bytes_.get() + offset_; }
  size_t size() const { return size_; }  // header + body
  size_t body_size() const {
    return size_ < kFrameHeaderBytes ? 0 : size_ - kFrameHeaderBytes;
  }

  // Valid only after Verify() returned OK.
  const wire::Message* message() const {
    return wire::GetSizePrefixedMessage(data());
  }

  // Checks the identifier and runs the FlatBuffers verifier over the whole
  // frame. Returns kBadFrame with a reason otherwise.
  Status Verify() const;

 private:
  PooledBytes bytes_;  // the whole allocation
  size_t offset_ = 0;  // where the header starts in it
  size_t size_ = 0;    // header + body
};

// Parses a header; kFrameTooLarge or kBadFrame when it cannot start a frame.
Result<uint32_t> ParseFrameHeader(const uint8_t header[kFrameHeaderBytes],
                                  size_t max_frame_bytes);

// A builder for an outgoing frame of about `expected_bytes`; large ones draw
// their buffer from the BufferPool.
inline PooledBuilder MakeBuilder(size_t expected_bytes) {
  return PooledBuilder(expected_bytes);
}

// An outgoing frame: one finished FlatBuffer, immutable once built and
// shared by every send of it. Some byte ranges ("splices") may be sent from
// memory elsewhere instead of from the buffer, so that large float payloads
// (a worker's gradient, a shard's weights) go out without being copied into
// the builder; the frame keeps that memory alive through `owners`, or the
// caller promises it outlives the send.
class OutBuffer {
 public:
  struct Splice {
    size_t offset = 0;  // into the frame
    const uint8_t* data = nullptr;
    size_t size = 0;
  };

  OutBuffer(flatbuffers::DetachedBuffer buffer, std::vector<Splice> splices,
            std::vector<std::shared_ptr<const void>> owners)
      : buffer_(std::move(buffer)),
        splices_(std::move(splices)),
        owners_(std::move(owners)) {}

  size_t size() const { return buffer_.size(); }
  // The frame's bytes; the spliced ranges hold no payload here.
  const uint8_t* data() const { return buffer_.data(); }
  // Spliced ranges in increasing offset order, not overlapping.
  const std::vector<Splice>& splices() const { return splices_; }

  // Calls f(pointer, size) for each piece of the frame in order: together
  // they are the bytes to send.
  template <typename F>
  void ForEachPiece(F&& f) const {
    size_t at = 0;
    for (const Splice& s : splices_) {
      if (s.offset > at) f(buffer_.data() + at, s.offset - at);
      f(s.data, s.size);
      at = s.offset + s.size;
    }
    if (at < buffer_.size()) f(buffer_.data() + at, buffer_.size() - at);
  }
  // The whole frame as contiguous bytes (for tests and tools).
  std::vector<uint8_t> Flatten() const;

 private:
  flatbuffers::DetachedBuffer buffer_;
  std::vector<Splice> splices_;
  std::vector<std::shared_ptr<const void>> owners_;
};

using OutFrame = std::shared_ptr<const OutBuffer>;

// Finishes `fbb` as a frame whose Message body is `body` of type `type`.
OutFrame FinishFrame(flatbuffers::FlatBufferBuilder& fbb, wire::Body type,
                     flatbuffers::Offset<void> body);

template <typename T>
OutFrame FinishFrame(flatbuffers::FlatBufferBuilder& fbb,
                     flatbuffers::Offset<T> body) {
  return FinishFrame(fbb, wire::BodyTraits<T>::enum_value, body.Union());
}

// Builds a frame whose float vectors are spliced in from elsewhere rather
// than copied. Use one per builder; not thread-safe.
class FrameSplicer {
 public:
  explicit FrameSplicer(flatbuffers::FlatBufferBuilder& fbb) : fbb_(fbb) {}

  // Reserves a float vector of values.size() in the builder and records
  // that its bytes are sent from `values`, which must stay valid and
  // unchanged until the frame is written (or be owned by `owner`).
  flatbuffers::Offset<flatbuffers::Vector<float>> AddFloats(
      std::span<const float> values,
      std::shared_ptr<const void> owner = nullptr);

  template <typename T>
  OutFrame Finish(flatbuffers::Offset<T> body) {
    return Finish(wire::BodyTraits<T>::enum_value, body.Union());
  }
  OutFrame Finish(wire::Body type, flatbuffers::Offset<void> body);

 private:
  struct Pending {
    size_t from_end;  // distance of the data from the buffer's end
    const uint8_t* data;
    size_t size;
  };
  flatbuffers::FlatBufferBuilder& fbb_;
  std::vector<Pending> pending_;
  std::vector<std::shared_ptr<const void>> owners_;
};

// The wire code for a Status code, and back.
wire::ErrorCode ToWireCode(Code code);
Code FromWireCode(wire::ErrorCode code);

// An Error frame carrying `status`, tied to `request_id` (0 for none).
OutFrame MakeErrorFrame(uint64_t request_id, const Status& status);
// The same with a wire code more specific than the Status code maps to.
OutFrame MakeErrorFrame(uint64_t request_id, wire::ErrorCode code,
                        const std::string& message);

// The Status an Error message carries, prefixed by `peer`.
Status StatusFromError(const wire::Error& error, const std::string& peer);

}  // namespace tether
