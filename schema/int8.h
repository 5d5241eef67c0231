// int8 on the wire (WireDtype::kInt8): values in groups of kInt8Group, each
// group one float scale (its largest magnitude / 127) and one signed byte a
// value, value = byte * scale: about a quarter of f32's bytes. Clients with
// wire dtype int8 push gradients and pull weights so; shards widen pushes
// back to f32 on arrival and keep f32 weights and optimizer state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tether {

inline constexpr size_t kInt8Group = 256;
// The byte of a NaN or an infinity: it widens to NaN, and the group's scale
// is taken from its finite values.
inline constexpr int8_t kInt8NonFinite = -128;

// The number of scales `n` values take: one a group, the last one shorter.
inline constexpr size_t Int8Scales(size_t n) {
  return (n + kInt8Group - 1) / kInt8Group;
}

// Quantizes `in` into `out` (in.size() bytes) and `scales`
// (Int8Scales(in.size())), each value rounded to the nearest step of its
// group: off by at most half a step, scale / 2. A NaN or an infinity
// becomes kInt8NonFinite (widened: NaN), so that a shard refuses the push
// naming that element as it would an f32 one.
void ToInt8(std::span<const float> in, int8_t* out, float* scales);

// The same with stochastic rounding: each value goes to one of the two
// steps around it with the probabilities that make its expectation exact,
// so that rounding adds noise to a gradient but no bias. The dither is a
// pure function of `seed` and the value's index: the same inputs give the
// same bytes.
void ToInt8Dithered(std::span<const float> in, uint32_t seed, int8_t* out,
                    float* scales);

// out[i] = in[i] * scales[(first + i) / kInt8Group] (NaN for
// kInt8NonFinite): `in` holds values first.. of a sequence whose groups'
// scales are `scales`, which the caller has checked to hold them all
// (Int8Scales of the sequence's size).
void FromInt8(std::span<const int8_t> in, const float* scales, float* out,
              size_t first = 0);

// A seed for ToInt8Dithered from the numbers that name one push part (a
// tensor, a block or key, a clock), mixed so that nearby ones differ.
uint32_t Int8Seed(uint64_t a, uint64_t b, uint64_t c);

}  // namespace tether
