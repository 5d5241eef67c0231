#include "schema/wire_values.h"

#include <algorithm>
#include <string>
#include <vector>

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
  const size_t whole = 0;  // one row: all of `values`
  return AddNarrowedRows(fbb, values, {&whole, 1}, values.size(), dtype,
                         dither_seed);
}

wire::Dtype ToWire(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kBf16:
      return wire::Dtype::Bf16;
    case WireDtype::kInt8:
      return wire::Dtype::Int8;
    case WireDtype::kF32:
      break;
  }
  return wire::Dtype::F32;
}

Result<WireDtype> FromWire(wire::Dtype dtype) {
  switch (dtype) {
    case wire::Dtype::F32:
      return WireDtype::kF32;
    case wire::Dtype::Bf16:
      return WireDtype::kBf16;
    case wire::Dtype::Int8:
      return WireDtype::kInt8;
  }
  return InvalidArgument("dtype " + std::to_string(static_cast<int>(dtype)) +
                         ": expected 0 (f32), 1 (bf16) or 2 (int8)");
}

void GatherRows(std::span<const float> values,
                std::span<const size_t> positions, size_t dim, float* out) {
  for (size_t i = 0; i < positions.size(); ++i) {
    std::copy_n(values.data() + positions[i] * dim, dim, out + i * dim);
  }
}

NarrowedValues AddNarrowedRows(flatbuffers::FlatBufferBuilder& fbb,
                               std::span<const float> values,
                               std::span<const size_t> positions, size_t dim,
                               WireDtype dtype, const uint32_t* dither_seed) {
  const size_t n = positions.size() * dim;
  auto row = [&](size_t i) { return values.subspan(positions[i] * dim, dim); };
  NarrowedValues out;
  if (dtype == WireDtype::kBf16) {
    uint16_t* half = nullptr;
    out.bf16 = fbb.CreateUninitializedVector(n, &half);
    for (size_t i = 0; i < positions.size(); ++i) {
      ToBf16(row(i), half + i * dim);
    }
  } else if (dtype == WireDtype::kInt8) {
    // Rows apart in `values` are gathered first, into a buffer each thread
    // keeps (as large as its largest frame), so that no frame allocates.
    thread_local std::vector<float> gathered;
    std::span<const float> in;
    if (positions.size() == 1) {
      in = row(0);
    } else if (positions.size() > 1) {
      if (gathered.size() < n) gathered.resize(n);
      GatherRows(values, positions, dim, gathered.data());
      in = std::span<const float>(gathered.data(), n);
    }
    // Both vectors are made first and found again by offset: making the
    // second may move the first.
    float* unused_scales = nullptr;
    out.q8_scale = fbb.CreateUninitializedVector(Int8Scales(n), &unused_scales);
    int8_t* bytes = nullptr;
    out.q8 = fbb.CreateUninitializedVector(n, &bytes);
    float* scales =
        flatbuffers::GetMutableTemporaryPointer(fbb, out.q8_scale)->data();
    if (dither_seed != nullptr) {
      ToInt8Dithered(in, *dither_seed, bytes, scales);
    } else {
      ToInt8(in, bytes, scales);
    }
  }
  return out;
}

Status Widen(const NarrowedView& view, float* out, const std::string& what) {
  const size_t whole = 0;
  return WidenRows(view, {&whole, 1}, view.size(), out, what);
}

Status WidenRows(const NarrowedView& view, std::span<const size_t> positions,
                 size_t dim, float* out, const std::string& what) {
  if (view.bf16 != nullptr) {
    for (size_t i = 0; i < positions.size(); ++i) {
      FromBf16({view.bf16->data() + i * dim, dim}, out + positions[i] * dim);
    }
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
  for (size_t i = 0; i < positions.size(); ++i) {
    FromInt8({view.q8->data() + i * dim, dim}, view.q8_scale->data(),
             out + positions[i] * dim, i * dim);
  }
  return Status::Ok();
}

}  // namespace tether
