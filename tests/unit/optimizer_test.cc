#include "server/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace tether {
namespace {

constexpr OptimizerKind kEveryKind[] = {
    OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdaGrad,
    OptimizerKind::kAdam};

// n values drawn from N(0, scale^2); their magnitudes when `magnitudes`.
std::vector<float> Normal(std::mt19937& rng, size_t n, float scale = 1.0f,
                          bool magnitudes = false) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& x : values) x = magnitudes ? std::abs(normal(rng)) : normal(rng);
  return values;
}

Optimizer Make(OptimizerKind kind, float lr) {
  OptimizerOptions options;
  options.kind = kind;
  options.lr = lr;
  return Optimizer(options);
}

TEST(Optimizer, SgdMatchesHandComputedSteps) {
  const Optimizer opt = Make(OptimizerKind::kSgd, 0.1f);
  ASSERT_EQ(opt.slots_per_weight(), 0);
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  std::vector<float> slots;

  opt.Apply(w, slots, std::vector<float>{0.5f, -1.0f, 2.0f}, 1);
  EXPECT_FLOAT_EQ(w[0], 0.95f);  // 1 - 0.1 * 0.5
  EXPECT_FLOAT_EQ(w[1], -1.9f);  // -2 - 0.1 * -1
  EXPECT_FLOAT_EQ(w[2], 0.3f);   // 0.5 - 0.1 * 2

  opt.Apply(w, slots, std::vector<float>{1.0f, 1.0f, -0.5f}, 2);
  EXPECT_FLOAT_EQ(w[0], 0.85f);  // 0.95 - 0.1 * 1
  EXPECT_FLOAT_EQ(w[1], -2.0f);  // -1.9 - 0.1 * 1
  EXPECT_FLOAT_EQ(w[2], 0.35f);  // 0.3 - 0.1 * -0.5
}

TEST(Optimizer, MomentumMatchesHandComputedSteps) {
  const Optimizer opt = Make(OptimizerKind::kMomentum, 0.1f);  // mu = 0.9
  ASSERT_EQ(opt.slots_per_weight(), 1);
  std::vector<float> w = {1.0f, -1.0f};
  std::vector<float> v(2, 0.0f);

  opt.Apply(w, v, std::vector<float>{1.0f, 2.0f}, 1);
  // v = 0.9 * 0 + g = {1, 2}; w -= 0.1 * v
  EXPECT_FLOAT_EQ(v[0], 1.0f);
  EXPECT_FLOAT_EQ(v[1], 2.0f);
  EXPECT_FLOAT_EQ(w[0], 0.9f);   // 1 - 0.1
  EXPECT_FLOAT_EQ(w[1], -1.2f);  // -1 - 0.2

  opt.Apply(w, v, std::vector<float>{1.0f, -2.0f}, 2);
  // v = {0.9 * 1 + 1, 0.9 * 2 - 2} = {1.9, -0.2}
  EXPECT_FLOAT_EQ(v[0], 1.9f);
  EXPECT_NEAR(v[1], -0.2f, 1e-6);
  EXPECT_FLOAT_EQ(w[0], 0.71f);   // 0.9 - 0.19
  EXPECT_FLOAT_EQ(w[1], -1.18f);  // -1.2 + 0.02

  opt.Apply(w, v, std::vector<float>{0.0f, 0.0f}, 3);
  // A zero gradient still moves: v = {0.9 * 1.9, 0.9 * -0.2} = {1.71, -0.18}
  EXPECT_FLOAT_EQ(v[0], 1.71f);
  EXPECT_NEAR(v[1], -0.18f, 1e-6);
  EXPECT_NEAR(w[0], 0.539f, 1e-6);   // 0.71 - 0.171
  EXPECT_NEAR(w[1], -1.162f, 1e-6);  // -1.18 + 0.018
}

TEST(Optimizer, AdaGradMatchesHandComputedSteps) {
  // eps = 1e-8 is below float resolution next to sqrt(h) >= 3 here.
  const Optimizer opt = Make(OptimizerKind::kAdaGrad, 0.1f);
  ASSERT_EQ(opt.slots_per_weight(), 1);
  std::vector<float> w = {1.0f, 2.0f};
  std::vector<float> h(2, 0.0f);

  opt.Apply(w, h, std::vector<float>{3.0f, 4.0f}, 1);
  // h = {9, 16}; w -= 0.1 * {3 / 3, 4 / 4}
  EXPECT_FLOAT_EQ(h[0], 9.0f);
  EXPECT_FLOAT_EQ(h[1], 16.0f);
  EXPECT_NEAR(w[0], 0.9f, 1e-6);
  EXPECT_NEAR(w[1], 1.9f, 1e-6);

  opt.Apply(w, h, std::vector<float>{4.0f, 0.0f}, 2);
  // h = {25, 16}; w -= 0.1 * {4 / 5, 0 / 4}
  EXPECT_FLOAT_EQ(h[0], 25.0f);
  EXPECT_NEAR(w[0], 0.82f, 1e-6);  // 0.9 - 0.08
  EXPECT_NEAR(w[1], 1.9f, 1e-6);

  opt.Apply(w, h, std::vector<float>{0.0f, 3.0f}, 3);
  // h = {25, 25}; w -= 0.1 * {0 / 5, 3 / 5}
  EXPECT_FLOAT_EQ(h[1], 25.0f);
  EXPECT_NEAR(w[0], 0.82f, 1e-6);
  EXPECT_NEAR(w[1], 1.84f, 1e-6);  // 1.9 - 0.06
}

TEST(Optimizer, AdamMatchesHandComputedSteps) {
  // b1 = 0.9, b2 = 0.999, eps = 1e-8.
  const Optimizer opt = Make(OptimizerKind::kAdam, 0.1f);
  ASSERT_EQ(opt.slots_per_weight(), 2);
  std::vector<float> w = {1.0f, -1.0f, 0.5f};
  std::vector<float> slots(6, 0.0f);  // m[0..3), v[3..6)

  opt.Apply(w, slots, std::vector<float>{1.0f, -2.0f, 0.5f}, 1);
  // m = 0.1 g = {0.1, -0.2, 0.05}; v = 0.001 g^2 = {0.001, 0.004, 0.00025}.
  // The bias correction (1 - 0.9, 1 - 0.999) gives back g and g^2, so each
  // weight moves by lr * g / |g| = 0.1 against its gradient's sign.
  EXPECT_NEAR(slots[0], 0.1f, 1e-6);
  EXPECT_NEAR(slots[1], -0.2f, 1e-6);
  EXPECT_NEAR(slots[2], 0.05f, 1e-6);
  EXPECT_NEAR(slots[3], 0.001f, 1e-6);
  EXPECT_NEAR(slots[4], 0.004f, 1e-6);
  EXPECT_NEAR(slots[5], 0.00025f, 1e-6);
  EXPECT_NEAR(w[0], 0.9f, 1e-6);
  EXPECT_NEAR(w[1], -0.9f, 1e-6);
  EXPECT_NEAR(w[2], 0.4f, 1e-6);

  opt.Apply(w, slots, std::vector<float>{1.0f, 1.0f, 0.0f}, 2);
  // m = 0.9 m + 0.1 g = {0.19, -0.08, 0.045}
  // v = 0.999 v + 0.001 g^2 = {0.001999, 0.004996, 0.00024975}
  // c1 = 1 - 0.81 = 0.19; c2 = 1 - 0.998001 = 0.001999
  // w0: mhat = 1, vhat = 1: 0.9 - 0.1 = 0.8
  // w1: mhat = -0.421052632, vhat = 2.499249625 (sqrt 1.580901523):
  //     -0.9 + 0.1 * 0.421052632 / 1.580901523 = -0.9 + 0.026633704
  // w2: mhat = 0.236842105, vhat = 0.124937469 (sqrt 0.353464947):
  //     0.4 - 0.1 * 0.236842105 / 0.353464947 = 0.4 - 0.067005824
  EXPECT_NEAR(slots[0], 0.19f, 1e-6);
  EXPECT_NEAR(slots[1], -0.08f, 1e-6);
  EXPECT_NEAR(slots[2], 0.045f, 1e-6);
  EXPECT_NEAR(slots[3], 0.001999f, 1e-6);
  EXPECT_NEAR(slots[4], 0.004996f, 1e-6);
  EXPECT_NEAR(slots[5], 0.00024975f, 1e-6);
  EXPECT_NEAR(w[0], 0.8f, 1e-6);
  EXPECT_NEAR(w[1], -0.873366296f, 1e-6);
  EXPECT_NEAR(w[2], 0.332994176f, 1e-6);
}

TEST(Optimizer, LrScaleHalvesTheStep) {
  const Optimizer opt = Make(OptimizerKind::kSgd, 0.1f);
  std::vector<float> w = {1.0f, -1.0f};
  std::vector<float> slots;
  opt.Apply(w, slots, std::vector<float>{1.0f, -2.0f}, 1, 0.5f);
  EXPECT_FLOAT_EQ(w[0], 0.95f);  // 1 - 0.05 * 1
  EXPECT_FLOAT_EQ(w[1], -0.9f);  // -1 - 0.05 * -2
}

TEST(Optimizer, LrScaleHalvesTheMomentumStep) {
  const Optimizer opt = Make(OptimizerKind::kMomentum, 0.1f);
  std::vector<float> w = {1.0f};
  std::vector<float> v = {0.0f};
  opt.Apply(w, v, std::vector<float>{2.0f}, 1, 0.5f);
  EXPECT_FLOAT_EQ(v[0], 2.0f);  // the slot does not see the scale
  EXPECT_FLOAT_EQ(w[0], 0.9f);  // 1 - 0.05 * 2
}

TEST(Optimizer, ParseAcceptsEveryNameItPrints) {
  for (OptimizerKind kind : kEveryKind) {
    Result<OptimizerKind> parsed = ParseOptimizerKind(OptimizerName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, kind);
  }
}

TEST(Optimizer, ParseRejectsUnknownNameNamingIt) {
  Result<OptimizerKind> parsed = ParseOptimizerKind("foo");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("'foo'"), std::string::npos)
      << parsed.status().message();
  EXPECT_NE(parsed.status().message().find("adam"), std::string::npos)
      << parsed.status().message();
}

// The scalar reference: one element at a time, every intermediate forced
// to float (volatile), in the order optimizer.h gives the formulas.
struct Element {
  float w, s0, s1;
};
Element Reference(const OptimizerOptions& o, float lr_scale, uint64_t step,
                  float w, float s0, float s1, float g) {
  volatile float lr = o.lr * lr_scale;
  switch (o.kind) {
    case OptimizerKind::kSgd: {
      volatile float step_w = lr * g;
      return {w - step_w, 0, 0};
    }
    case OptimizerKind::kMomentum: {
      volatile float v = o.momentum * s0 + g;
      volatile float step_w = lr * v;
      return {w - step_w, v, 0};
    }
    case OptimizerKind::kAdaGrad: {
      volatile float h = s0 + g * g;
      volatile float denom = std::sqrt(static_cast<float>(h)) + o.epsilon;
      volatile float step_w = lr * g;
      return {w - step_w / denom, h, 0};
    }
    case OptimizerKind::kAdam: {
      const double t = static_cast<double>(step);
      const float step_size =
          static_cast<float>(double{lr} / (1.0 - std::pow(double{o.beta1}, t)));
      const float inv_sqrt_c2 = static_cast<float>(
          1.0 / std::sqrt(1.0 - std::pow(double{o.beta2}, t)));
      volatile float m = o.beta1 * s0 + (1.0f - o.beta1) * g;
      volatile float v = o.beta2 * s1 + (1.0f - o.beta2) * g * g;
      volatile float root = std::sqrt(static_cast<float>(v));
      volatile float denom = root * inv_sqrt_c2 + o.epsilon;
      volatile float step_w = step_size * m;
      return {w - step_w / denom, m, v};
    }
  }
  return {};
}

// The update loops run vectorized (SSE2, AVX2 or AVX-512, picked by the
// CPU); every element of every optimizer must still be exactly what the
// formula gives one at a time, so a shard's weights do not depend on the
// machine it runs on. 1003 weights: whole vectors of every width and a
// tail.
TEST(Optimizer, VectorizedLoopsAreBitIdenticalToTheScalarReference) {
  const size_t n = 1003;
  for (OptimizerKind kind : kEveryKind) {
    SCOPED_TRACE(OptimizerName(kind));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 0.001f;
    const Optimizer opt(o);
    const size_t k = static_cast<size_t>(opt.slots_per_weight());
    std::vector<float> w(n), g(n), slots(k * n);
    for (float& x : w) x = normal(rng);
    for (float& x : g) x = normal(rng);
    for (size_t i = 0; i < k * n; ++i) {
      // Second moments and AdaGrad's sums are not negative.
      const bool square = kind == OptimizerKind::kAdaGrad || i >= n;
      slots[i] = square ? std::abs(0.01f * normal(rng)) : 0.1f * normal(rng);
    }
    std::vector<float> w_out(n), slots_out(k * n);
    const uint64_t step = 5;
    const float lr_scale = 0.75f;
    ASSERT_TRUE(opt.Update(w, slots, g, w_out, slots_out, step, lr_scale));
    // In place, the same values to the bit.
    std::vector<float> w_in_place = w, slots_in_place = slots;
    ASSERT_TRUE(opt.Apply(w_in_place, slots_in_place, g, step, lr_scale));
    ASSERT_EQ(w_in_place, w_out);
    ASSERT_EQ(slots_in_place, slots_out);
    for (size_t i = 0; i < n; ++i) {
      const Element e = Reference(o, lr_scale, step, w[i], k > 0 ? slots[i] : 0,
                                  k > 1 ? slots[n + i] : 0, g[i]);
      ASSERT_EQ(std::bit_cast<uint32_t>(w_out[i]), std::bit_cast<uint32_t>(e.w))
          << "w at " << i;
      if (k > 0) {
        ASSERT_EQ(std::bit_cast<uint32_t>(slots_out[i]),
                  std::bit_cast<uint32_t>(e.s0))
            << "slot 0 at " << i;
      }
      if (k > 1) {
        ASSERT_EQ(std::bit_cast<uint32_t>(slots_out[n + i]),
                  std::bit_cast<uint32_t>(e.s1))
            << "slot 1 at " << i;
      }
    }
  }
}

#if defined(__x86_64__)
// Subnormal moments (a weight whose input stayed zero for a while) and
// gradients are taken as zero, and so are subnormal results: each would
// cost a microcode assist per operation on x86. The caller's own
// floating-point mode is left as it was.
TEST(Optimizer, SubnormalsAreTakenAndLeftAsZeroAndTheCallersModeKept) {
  const float tiny = 1e-39f;  // subnormal: below 2^-126
  ASSERT_EQ(std::fpclassify(tiny), FP_SUBNORMAL);
  const unsigned mode = _mm_getcsr();
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.lr = 0.001f;
  const Optimizer adam(o);
  const size_t n = 37;
  // Subnormal moments, no gradient: without the flush m would become
  // beta1 * tiny and v beta2 * tiny, both still subnormal.
  std::vector<float> w(n, 0.5f), g(n, 0.0f), slots(2 * n, tiny);
  std::vector<float> w_out(n), slots_out(2 * n);
  ASSERT_TRUE(adam.Update(w, slots, g, w_out, slots_out, 3));
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(w_out[i], 0.5f) << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(slots_out[i]), 0u) << "m at " << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(slots_out[n + i]), 0u) << "v at " << i;
  }
  // A subnormal gradient moves nothing: (1 - beta1) * g would be
  // subnormal too.
  std::fill(g.begin(), g.end(), tiny);
  std::fill(slots.begin(), slots.end(), 0.0f);
  ASSERT_TRUE(adam.Update(w, slots, g, w_out, slots_out, 3));
  for (size_t i = 0; i < 2 * n; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(slots_out[i]), 0u) << "slot at " << i;
  }
  // Normal values are as before: a step of about lr.
  std::fill(g.begin(), g.end(), 1.0f);
  ASSERT_TRUE(adam.Update(w, slots, g, w_out, slots_out, 1));
  EXPECT_NEAR(w_out[0], 0.5f - 0.001f, 1e-6f);
  EXPECT_EQ(_mm_getcsr(), mode);
}
#endif

// Update checks what it writes as it writes it (no second pass), Apply
// before it writes: a weight or any optimizer slot that comes out Inf or
// NaN, at any position of the vectorized body or its tail, makes either
// return false, and Apply then leaves every weight and slot as it was.
TEST(Optimizer, UpdateRefusesANonFiniteResultInAnyOutputAndPosition) {
  const size_t n = 67;  // whole vectors of every width and a tail
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (OptimizerKind kind : kEveryKind) {
    SCOPED_TRACE(OptimizerName(kind));
    const Optimizer opt = Make(kind, 0.01f);
    const size_t k = static_cast<size_t>(opt.slots_per_weight());
    std::vector<float> w(n, 0.5f), g(n, 0.25f), slots(k * n, 0.125f);
    std::vector<float> w_out(n), slots_out(k * n);
    ASSERT_TRUE(opt.Update(w, slots, g, w_out, slots_out, 2));
    for (size_t i = 0; i < n; ++i) {
      // Apply on copies: refused, it must leave them bit for bit.
      auto expect_apply_refused = [&](const std::string& what) {
        std::vector<float> w_copy = w, slots_copy = slots;
        EXPECT_FALSE(opt.Apply(w_copy, slots_copy, g, 2)) << what;
        EXPECT_EQ(std::memcmp(w_copy.data(), w.data(), n * sizeof(float)), 0)
            << what;
        EXPECT_EQ(
            std::memcmp(slots_copy.data(), slots.data(), k * n * sizeof(float)),
            0)
            << what;
      };
      w[i] = std::numeric_limits<float>::infinity();
      EXPECT_FALSE(opt.Update(w, slots, g, w_out, slots_out, 2))
          << "weight " << i;
      expect_apply_refused("weight " + std::to_string(i));
      w[i] = 0.5f;
      for (size_t j = 0; j < k; ++j) {
        slots[j * n + i] = nan;
        EXPECT_FALSE(opt.Update(w, slots, g, w_out, slots_out, 2))
            << "slot " << j << " of weight " << i;
        expect_apply_refused("slot " + std::to_string(j) + " of weight " +
                             std::to_string(i));
        slots[j * n + i] = 0.125f;
      }
    }
    ASSERT_TRUE(opt.Update(w, slots, g, w_out, slots_out, 2));
  }
  // A finite gradient whose square overflows: only Adam's second moment
  // becomes Inf (the weight's step is then 0, finite), and that is enough.
  const Optimizer adam = Make(OptimizerKind::kAdam, 0.01f);
  std::vector<float> w(n, 0.5f), g(n, 0.25f), slots(2 * n, 0.125f);
  std::vector<float> w_out(n), slots_out(2 * n);
  g[n - 1] = 1e30f;
  EXPECT_FALSE(adam.Update(w, slots, g, w_out, slots_out, 2));
  EXPECT_TRUE(std::isinf(slots_out[2 * n - 1]));
  EXPECT_TRUE(std::isfinite(w_out[n - 1]));
  EXPECT_FALSE(adam.Apply(w, slots, g, 2));
  EXPECT_EQ(w, std::vector<float>(n, 0.5f));
  EXPECT_EQ(slots, std::vector<float>(2 * n, 0.125f));
}

// With the block's bound, Apply writes in one pass when the bound and the
// gradient prove nothing can overflow: the same values to the bit as
// without it, the bound then the largest magnitude written; and where they
// prove nothing (a gradient or a state near overflow) every result is
// still checked first and a refused update writes nothing.
// Also with the gradient's bound given (as a shard's push check measures
// it) on every other step.
TEST(Optimizer, ApplyWithABoundWritesTheSameValuesAndStillRefusesOverflow) {
  const size_t n = 1003;
  for (OptimizerKind kind : kEveryKind) {
    SCOPED_TRACE(OptimizerName(kind));
    const Optimizer opt = Make(kind, 0.01f);
    const size_t k = static_cast<size_t>(opt.slots_per_weight());
    std::mt19937 rng(11);
    std::vector<float> w = Normal(rng, n);
    std::vector<float> slots = Normal(rng, k * n, 0.1f, /*magnitudes=*/true);
    float bound = std::numeric_limits<float>::infinity();
    for (uint64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = Normal(rng, n);
      std::vector<float> w_out(n), slots_out(k * n);
      ASSERT_TRUE(opt.Update(w, slots, g, w_out, slots_out, step));
      const float grad_bound = step % 2 == 0
                                   ? MaxMagnitude(g)
                                   : std::numeric_limits<float>::infinity();
      ASSERT_TRUE(opt.Apply(w, slots, g, step, 1.0f, &bound, grad_bound));
      ASSERT_EQ(std::memcmp(w.data(), w_out.data(), n * sizeof(float)), 0)
          << "step " << step;
      ASSERT_EQ(
          std::memcmp(slots.data(), slots_out.data(), k * n * sizeof(float)), 0)
          << "step " << step;
      float largest = 0;
      for (float x : w) largest = std::max(largest, std::abs(x));
      for (float x : slots) largest = std::max(largest, std::abs(x));
      EXPECT_EQ(bound, largest) << "step " << step;
    }
    // A gradient whose square or step (at lr 10) overflows: refused with a
    // finite bound too, nothing written, the bound kept.
    const std::vector<float> w_before = w, slots_before = slots;
    const float bound_before = bound;
    std::vector<float> huge(n, 0.5f);
    huge[n - 1] = 3e38f;
    EXPECT_FALSE(Make(kind, 10.0f).Apply(w, slots, huge, 4, 1.0f, &bound));
    EXPECT_FALSE(
        Make(kind, 10.0f)
            .Apply(w, slots, huge, 4, 1.0f, &bound, MaxMagnitude(huge)));
    EXPECT_EQ(w, w_before);
    EXPECT_EQ(slots, slots_before);
    EXPECT_EQ(bound, bound_before);
  }
  // A state near overflow (its bound says so) and a gradient that tips a
  // momentum over: checked, refused.
  const Optimizer momentum = Make(OptimizerKind::kMomentum, 0.01f);
  std::vector<float> w(n, 1.0f), v(n, 1.0f), g(n, 1.0f);
  v[5] = 3e38f;
  g[5] = 1e38f;
  float bound = 3e38f;
  EXPECT_FALSE(momentum.Apply(w, v, g, 2, 1.0f, &bound));
  EXPECT_FALSE(momentum.Apply(w, v, g, 2, 1.0f, &bound, 1e38f));
  EXPECT_EQ(v[5], 3e38f);
  EXPECT_EQ(w[5], 1.0f);
  EXPECT_EQ(bound, 3e38f);
}

TEST(Optimizer, MaxMagnitudeIsInfWhenAnyValueIsNotFiniteInAnyPosition) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values(37, 1.5f);
  EXPECT_EQ(MaxMagnitude({}), 0.0f);
  EXPECT_EQ(MaxMagnitude(values), 1.5f);
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf};
  for (float b : bad) {
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = b;
      EXPECT_EQ(MaxMagnitude(values), inf) << "value " << b << " at " << i;
      EXPECT_EQ(FirstNonFinite(values), i);
      values[i] = 1.5f;
    }
  }
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = -7.25f;
    EXPECT_EQ(MaxMagnitude(values), 7.25f) << "at " << i;
    values[i] = 1.5f;
  }
  values[3] = -std::numeric_limits<float>::max();
  values[4] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(MaxMagnitude(values), std::numeric_limits<float>::max());
  EXPECT_EQ(FirstNonFinite(values), values.size());
}

}  // namespace
}  // namespace tether
