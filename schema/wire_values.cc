#include "schema/wire_values.h"

#include <string>

#include "schema/bf16.h"
#include "schema/int8.h"

namespace tether {

Result<WireDtype> ParseWireDtype(const std::string& name,
                                 const std::string& flag) {
  if (name == "f32") return WireDtype::kF32;
  if (name == "bf16") return WireDtype::kBf16;
  if (name == "int8") return WireDtype::kInt8;
  return InvalidArgument(flag + ": f32, bf16 or int8, not '" + name + "'");
}

NarrowedValues AddNarrowed(flatbuffers::FlatBufferBuilder& fbb,
                           std::span<const float> values, WireDtype dtype,
                           const uint32_t* dither_seed) {
  NarrowedValues out;
  if (dtype == WireDtype::kBf16) {
    uint16_t* half = nullptr;
    out.bf16 = fbb.CreateUninitializedVector(values.size(), &half);
    ToBf16(values, half);
  } else if (dtype == WireDtype::kInt8) {
    // Both vectors are made first and found again by offset: making the
    // second may move the first.
    float* unused_scales = nullptr;
    out.q8_scale = fbb.CreateUninitializedVector(Int8Scales(values.size()),
                                                 &unused_scales);
    int8_t* bytes = nullptr;
    out.q8 = fbb.CreateUninitializedVector(values.size(), &bytes);
    float* scales =
        flatbuffers::GetMutableTemporaryPointer(fbb, out.q8_scale)->data();
    if (dither_seed != nullptr) {
      ToInt8Dithered(values, *dither_seed, bytes, scales);
    } else {
      ToInt8(values, bytes, scales);
    }
  }
  return out;
}

Status Widen(const NarrowedView& view, float* out, const std::string& what) {
  if (view.bf16 != nullptr) {
    FromBf16({view.bf16->data(), view.bf16->size()}, out);
    return Status::Ok();
  }
  if (view.q8 == nullptr) return Status::Ok();
  const size_t want = Int8Scales(view.q8->size());
  const size_t got = view.q8_scale == nullptr ? 0 : view.q8_scale->size();
  if (got != want) {
    return InvalidArgument(what + " carries " +
                           std::to_string(view.q8->size()) +
                           " int8 values with " + std::to_string(got) +
                           " scales, not " + std::to_string(want));
  }
  if (want == 0) return Status::Ok();  // no values, and so no scales
  FromInt8({view.q8->data(), view.q8->size()}, view.q8_scale->data(), out);
  return Status::Ok();
}

}  // namespace tether
