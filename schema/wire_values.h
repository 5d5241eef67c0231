// Values in a frame as the wire dtype says (schema/wire_dtype.h): a block's
// or a set of rows' floats narrowed into a frame being built, and read back
// (widened) with their sizes checked. Shared by the client, which narrows
// gradients and widens weights, and the shards, which do the reverse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "flatbuffers/flatbuffers.h"
#include "schema/status.h"
#include "schema/tether_generated.h"
#include "schema/wire_dtype.h"

namespace tether {

// The dtype named "f32", "bf16" or "int8"; kInvalidArgument naming `flag`
// (e.g. "--wire-dtype") otherwise.
Result<WireDtype> ParseWireDtype(const std::string& name,
                                 const std::string& flag);

// The dtype as a Pull names it, and back. A value no Dtype has (a malformed
// frame, or a newer client's) is refused, naming it.
wire::Dtype ToWire(WireDtype dtype);
Result<WireDtype> FromWire(wire::Dtype dtype);

// Bytes a value takes on the wire at most, for sizing frames (int8: its
// byte and its share of the group's scale).
inline size_t WireBytes(WireDtype dtype) {
  return dtype == WireDtype::kF32 ? 4 : 2;
}

// `values` narrowed into a builder: `bf16`, or `q8` with `q8_scale`; the
// offsets of the other dtype are null.
struct NarrowedValues {
  flatbuffers::Offset<flatbuffers::Vector<uint16_t>> bf16;
  flatbuffers::Offset<flatbuffers::Vector<int8_t>> q8;
  flatbuffers::Offset<flatbuffers::Vector<float>> q8_scale;
};

// Writes `values` into `fbb` as `dtype` (kBf16 or kInt8; kF32 writes
// nothing: f32 values are spliced or copied by the caller). int8 rounds
// stochastically with `dither_seed` (a gradient) or, without one, to
// nearest (weights).
NarrowedValues AddNarrowed(flatbuffers::FlatBufferBuilder& fbb,
                           std::span<const float> values, WireDtype dtype,
                           const uint32_t* dither_seed = nullptr);

// The same for the rows of a sparse tensor picked by `positions`, one
// after another as if gathered: row i is values[positions[i] * dim, +dim).
// bf16 narrows each row straight into the frame; int8 gathers them first,
// since its groups of 256 cross rows.
NarrowedValues AddNarrowedRows(flatbuffers::FlatBufferBuilder& fbb,
                               std::span<const float> values,
                               std::span<const size_t> positions, size_t dim,
                               WireDtype dtype, const uint32_t* dither_seed);

// Copies the rows of `values` picked by `positions` to `out`, one after
// another: row i (values[positions[i] * dim, +dim)) to out[i * dim, +dim).
void GatherRows(std::span<const float> values,
                std::span<const size_t> positions, size_t dim, float* out);

// Narrowed values as a frame carries them; null where absent.
struct NarrowedView {
  const flatbuffers::Vector<uint16_t>* bf16 = nullptr;
  const flatbuffers::Vector<int8_t>* q8 = nullptr;
  const flatbuffers::Vector<float>* q8_scale = nullptr;

  bool present() const { return bf16 != nullptr || q8 != nullptr; }
  // How many values they hold.
  size_t size() const {
    return bf16 != nullptr ? bf16->size() : q8 != nullptr ? q8->size() : 0;
  }
};

// Widens `view` (its size() values) into `out`. kInvalidArgument, naming
// `what`, if int8 values come without one scale per 256 of them.
Status Widen(const NarrowedView& view, float* out, const std::string& what);

// The same for rows of `dim` values: row i of `view` is widened straight
// into out[positions[i] * dim, +dim). view.size() must be
// positions.size() * dim (the caller checks).
Status WidenRows(const NarrowedView& view, std::span<const size_t> positions,
                 size_t dim, float* out, const std::string& what);

}  // namespace tether
