// int8 on the wire (schema/int8.h) and the narrowed values of a frame
// (schema/wire_values.h): rounding within a step, stochastic rounding
// without bias, non-finite values kept per element, the vector clones
// against a scalar reference, and int8 values without their scales refused.
#include "schema/wire_values.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "schema/int8.h"

namespace tether {
namespace {

std::vector<float> Widened(const std::vector<int8_t>& q,
                           const std::vector<float>& scales) {
  std::vector<float> out(q.size());
  FromInt8(q, scales.data(), out.data());
  return out;
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;
};

Quantized Nearest(const std::vector<float>& in) {
  Quantized out{std::vector<int8_t>(in.size()),
                std::vector<float>(Int8Scales(in.size()))};
  ToInt8(in, out.q.data(), out.scales.data());
  return out;
}

Quantized Dithered(const std::vector<float>& in, uint32_t seed) {
  Quantized out{std::vector<int8_t>(in.size()),
                std::vector<float>(Int8Scales(in.size()))};
  ToInt8Dithered(in, seed, out.q.data(), out.scales.data());
  return out;
}

// Values over several orders of magnitude, signs mixed, the last group
// shorter than the others.
std::vector<float> Mixed(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::sin(i * 0.91f) * std::pow(10.0f, static_cast<float>(i % 5) - 3);
  }
  return v;
}

TEST(Int8, NearestIsWithinHalfAStepAndKeepsEachGroupsLargest) {
  const std::vector<float> in = Mixed(3 * kInt8Group + 77);
  const Quantized q = Nearest(in);
  ASSERT_EQ(q.scales.size(), 4u);
  const std::vector<float> back = Widened(q.q, q.scales);
  for (size_t g = 0; g < q.scales.size(); ++g) {
    float most = 0;
    size_t at = 0;
    for (size_t i = g * kInt8Group;
         i < std::min(in.size(), (g + 1) * kInt8Group); ++i) {
      if (std::fabs(in[i]) > most) most = std::fabs(in[i]), at = i;
    }
    EXPECT_FLOAT_EQ(q.scales[g], most / 127) << "group " << g;
    EXPECT_EQ(std::abs(q.q[at]), 127) << "group " << g;
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const float step = q.scales[i / kInt8Group];
    ASSERT_LE(std::fabs(back[i] - in[i]), step * 0.5f * 1.0001f) << i;
    ASSERT_GE(q.q[i], -127) << i;
  }
}

// The expectation of a dithered value is the value: averaged over many
// seeds each value comes within a small fraction of a step of itself, and
// every rounding lands on one of the two steps around it. Rounding to
// nearest, by contrast, moves small values of a group with a large one to
// zero every time.
TEST(Int8, DitheredIsUnbiasedAndOnTheTwoStepsAround) {
  std::vector<float> in(kInt8Group);
  in[0] = 127.0f;  // the step is 1
  for (size_t i = 1; i < in.size(); ++i) {
    in[i] = (i % 2 ? 1.0f : -1.0f) * (0.05f + 0.9f * (i % 17) / 17.0f);
  }
  constexpr int kSeeds = 4000;
  std::vector<double> sum(in.size(), 0.0);
  for (int seed = 0; seed < kSeeds; ++seed) {
    const Quantized q = Dithered(in, Int8Seed(seed, 1, 2));
    ASSERT_FLOAT_EQ(q.scales[0], 1.0f);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_TRUE(q.q[i] == std::floor(in[i]) || q.q[i] == std::ceil(in[i]))
          << in[i] << " went to " << int{q.q[i]};
      sum[i] += q.q[i];
    }
  }
  for (size_t i = 1; i < in.size(); ++i) {
    // The mean of 4000 draws of a two-point variable: sd <= 0.5 / 63.
    EXPECT_NEAR(sum[i] / kSeeds, in[i], 0.04) << i;
  }
  const Quantized nearest = Nearest(in);
  int zeros = 0;
  for (size_t i = 1; i < in.size(); ++i) zeros += nearest.q[i] == 0;
  EXPECT_GT(zeros, 100);
}

TEST(Int8, DitherIsAPureFunctionOfTheSeed) {
  const std::vector<float> in = Mixed(1000);
  const Quantized a = Dithered(in, 42);
  const Quantized b = Dithered(in, 42);
  const Quantized c = Dithered(in, 43);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.scales, c.scales);
  EXPECT_NE(a.q, c.q);
  EXPECT_NE(Int8Seed(1, 2, 3), Int8Seed(1, 2, 4));
  EXPECT_NE(Int8Seed(1, 2, 3), Int8Seed(2, 1, 3));
}

// A NaN or an infinity widens to NaN where it was, and only there: the
// scale comes from the group's finite values.
TEST(Int8, NonFiniteValuesStayNonFiniteAndSpoilNothingElse) {
  std::vector<float> in(300, 0.5f);
  in[3] = 2.0f;
  in[5] = std::numeric_limits<float>::infinity();
  in[7] = -std::numeric_limits<float>::infinity();
  in[260] = std::numeric_limits<float>::quiet_NaN();
  for (const Quantized& q : {Nearest(in), Dithered(in, 9)}) {
    EXPECT_FLOAT_EQ(q.scales[0], 2.0f / 127);
    EXPECT_FLOAT_EQ(q.scales[1], 0.5f / 127);
    const std::vector<float> back = Widened(q.q, q.scales);
    for (size_t i = 0; i < in.size(); ++i) {
      if (std::isfinite(in[i])) {
        ASSERT_NEAR(back[i], in[i], q.scales[i / kInt8Group]) << i;
      } else {
        ASSERT_TRUE(std::isnan(back[i])) << i;
      }
    }
  }
}

// Zeros, and values too small to scale, go as zeros with a zero scale.
TEST(Int8, ZerosAndTinyGroupsWidenToZeros) {
  std::vector<float> in(kInt8Group * 2, 0.0f);
  for (size_t i = kInt8Group; i < in.size(); ++i) in[i] = 1e-40f;
  const Quantized q = Nearest(in);
  EXPECT_EQ(q.scales, (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(Widened(q.q, q.scales), std::vector<float>(in.size(), 0.0f));
}

// The span forms run the CPU's widest clone (AVX-512 or AVX2 where there
// is one): the same bytes as a scalar reference of the same arithmetic,
// for every length's tail and an unaligned start.
TEST(Int8, ClonesGiveTheScalarReferencesBytes) {
  const std::vector<float> all = Mixed(4 * kInt8Group + 3);
  for (size_t n : {size_t{1}, size_t{15}, size_t{33}, kInt8Group - 1,
                   kInt8Group, kInt8Group + 1, 3 * kInt8Group + 2}) {
    const std::vector<float> in(all.begin() + 1, all.begin() + 1 + n);
    const Quantized q = Nearest(in);
    for (size_t g = 0; g < q.scales.size(); ++g) {
      float most = 0;
      for (size_t i = g * kInt8Group; i < std::min(n, (g + 1) * kInt8Group);
           ++i) {
        most = std::max(most, std::fabs(in[i]));
      }
      ASSERT_EQ(q.scales[g], most / 127.0f) << n << " " << g;
      const float to_steps = 127.0f / most;
      for (size_t i = g * kInt8Group; i < std::min(n, (g + 1) * kInt8Group);
           ++i) {
        volatile float product = in[i] * to_steps;
        const int want = static_cast<int>(product + 128.5f) - 128;
        ASSERT_EQ(q.q[i], std::max(-127, std::min(127, want))) << n << " " << i;
      }
    }
    std::vector<float> back(n + 1, 7.0f);
    FromInt8(q.q, q.scales.data(), back.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(back[i], q.q[i] * q.scales[i / kInt8Group]) << n << " " << i;
    }
    EXPECT_EQ(back[n], 7.0f) << "wrote past " << n;
  }
}

TEST(WireValues, Int8WithoutItsScalesIsRefusedNamingWhat) {
  flatbuffers::FlatBufferBuilder fbb;
  const std::vector<int8_t> q(300, 1);
  const std::vector<float> one = {0.5f};
  fbb.Finish(fbb.CreateVector(q));
  const auto* bytes =
      flatbuffers::GetRoot<flatbuffers::Vector<int8_t>>(fbb.GetBufferPointer());
  flatbuffers::FlatBufferBuilder sfb;
  sfb.Finish(sfb.CreateVector(one));
  const auto* scales =
      flatbuffers::GetRoot<flatbuffers::Vector<float>>(sfb.GetBufferPointer());
  std::vector<float> out(300);
  Status s = Widen({nullptr, bytes, scales}, out.data(), "push block 4");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "push block 4 carries 300 int8 values with 1 scales, not 2");
  s = Widen({nullptr, bytes, nullptr}, out.data(), "rows");
  EXPECT_EQ(s.message(), "rows carries 300 int8 values with 0 scales, not 2");
  // No values need no scales.
  flatbuffers::FlatBufferBuilder efb;
  efb.Finish(efb.CreateVector(std::vector<int8_t>{}));
  const auto* none =
      flatbuffers::GetRoot<flatbuffers::Vector<int8_t>>(efb.GetBufferPointer());
  EXPECT_TRUE(Widen({nullptr, none, nullptr}, out.data(), "rows").ok());
}

// A narrowed vector's values, as a frame being built holds them.
template <typename T>
std::vector<T> Held(flatbuffers::FlatBufferBuilder& fbb,
                    flatbuffers::Offset<flatbuffers::Vector<T>> offset) {
  if (offset.IsNull()) return {};
  const auto* v = flatbuffers::GetTemporaryPointer(fbb, offset);
  return {v->begin(), v->end()};
}

// Sparse rows go narrowed and widened row by row, straight from and to
// their positions: the bytes are those of the rows gathered first, and
// each row comes back to its own position, whether or not int8's groups
// of 256 cross rows.
TEST(WireValues, RowsNarrowAndWidenAsTheirValuesGatheredWould) {
  for (const size_t dim : {size_t{100}, size_t{256}, size_t{1}}) {
    const size_t rows = 8;
    const std::vector<float> values = Mixed(rows * dim);
    const std::vector<size_t> positions = {7, 2, 5, 0, 3};
    std::vector<float> gathered;
    for (size_t p : positions) {
      gathered.insert(gathered.end(), values.begin() + p * dim,
                      values.begin() + (p + 1) * dim);
    }
    const uint32_t seed = 99;
    for (const WireDtype dtype : {WireDtype::kBf16, WireDtype::kInt8}) {
      SCOPED_TRACE(std::to_string(dim) +
                   (dtype == WireDtype::kBf16 ? " bf16" : " int8"));
      flatbuffers::FlatBufferBuilder a;
      flatbuffers::FlatBufferBuilder b;
      const NarrowedValues by_row =
          AddNarrowedRows(a, values, positions, dim, dtype, &seed);
      const NarrowedValues whole = AddNarrowed(b, gathered, dtype, &seed);
      ASSERT_EQ(Held(a, by_row.bf16), Held(b, whole.bf16));
      ASSERT_EQ(Held(a, by_row.q8), Held(b, whole.q8));
      ASSERT_EQ(Held(a, by_row.q8_scale), Held(b, whole.q8_scale));

      const auto view = [](flatbuffers::FlatBufferBuilder& fbb,
                           const NarrowedValues& v) {
        NarrowedView out;
        if (!v.bf16.IsNull())
          out.bf16 = flatbuffers::GetTemporaryPointer(fbb, v.bf16);
        if (!v.q8.IsNull()) {
          out.q8 = flatbuffers::GetTemporaryPointer(fbb, v.q8);
          out.q8_scale = flatbuffers::GetTemporaryPointer(fbb, v.q8_scale);
        }
        return out;
      };
      std::vector<float> wide(gathered.size());
      ASSERT_TRUE(Widen(view(b, whole), wide.data(), "rows").ok());
      const float untouched = -7.0f;
      std::vector<float> out(values.size(), untouched);
      ASSERT_TRUE(
          WidenRows(view(a, by_row), positions, dim, out.data(), "rows").ok());
      for (size_t r = 0; r < rows; ++r) {
        const auto at = std::find(positions.begin(), positions.end(), r);
        for (size_t j = 0; j < dim; ++j) {
          const float want = at == positions.end()
                                 ? untouched
                                 : wide[(at - positions.begin()) * dim + j];
          ASSERT_EQ(out[r * dim + j], want) << "row " << r << " value " << j;
        }
      }
    }
  }
}

TEST(WireValues, ParseWireDtypeNamesTheFlag) {
  EXPECT_EQ(*ParseWireDtype("f32", "--x"), WireDtype::kF32);
  EXPECT_EQ(*ParseWireDtype("bf16", "--x"), WireDtype::kBf16);
  EXPECT_EQ(*ParseWireDtype("int8", "--x"), WireDtype::kInt8);
  auto bad = ParseWireDtype("fp8", "--wire-dtype");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--wire-dtype: f32, bf16 or int8, not 'fp8'");
}

// Each dtype travels as its own wire::Dtype and comes back; a value the
// protocol does not have is refused, naming it.
TEST(WireValues, DtypesRoundTripThroughTheWireEnumAndUnknownOnesAreRefused) {
  for (WireDtype d : {WireDtype::kF32, WireDtype::kBf16, WireDtype::kInt8}) {
    auto back = FromWire(ToWire(d));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, d);
  }
  EXPECT_NE(ToWire(WireDtype::kBf16), ToWire(WireDtype::kInt8));
  auto bad = FromWire(static_cast<wire::Dtype>(9));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "dtype 9: expected 0 (f32), 1 (bf16) or 2 (int8)");
}

}  // namespace
}  // namespace tether
