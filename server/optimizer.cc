#include "server/optimizer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <vector>

#include "schema/float_bits.h"
#include "schema/vector_clones.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

// The shard's arithmetic hot path: the update loops and the finiteness
// scan are built for SSE2, AVX2 and AVX-512 (TETHER_VECTOR_CLONES). All do
// the same IEEE operations in the same order (no FMA contraction:
// -ffp-contract=off; no reassociation), so a shard's weights are
// bit-identical whichever runs.

namespace tether {

namespace {

// The largest AbsBits of x[0..n).
[[gnu::always_inline]] inline uint32_t MaxAbsBits(size_t n,
                                                  const float* __restrict x) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) top = std::max(top, AbsBits(x[i]));
  return top;
}

// The magnitude whose bits are `bits`, any NaN's taken as +Inf.
float MagnitudeOf(uint32_t bits) {
  return std::bit_cast<float>(std::min(bits, kInfinityBits));
}

}  // namespace

TETHER_VECTOR_CLONES float MaxMagnitude(std::span<const float> values) {
  return MagnitudeOf(MaxAbsBits(values.size(), values.data()));
}

int Optimizer::slots_per_weight() const {
  switch (options_.kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kAdaGrad:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
  }
  return 0;
}

size_t FirstNonFinite(std::span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return values.size();
}

namespace {

// Each optimizer's arithmetic for one weight, as a rule: from the weight
// `w`, its gradient `g` and its slots `s0`, `s1` (those it has), the new
// weight and slots, in the order optimizer.h gives the formulas. The loops
// below run a rule over n weights; inlined into each clone of Update and
// Apply, they are vectorized for it.
struct Next {
  float w, s0, s1;
};

struct SgdRule {
  static constexpr int kSlots = 0;
  float lr;
  [[gnu::always_inline]] Next operator()(float w, float g, float, float) const {
    return {w - lr * g, 0.0f, 0.0f};
  }
};

struct MomentumRule {
  static constexpr int kSlots = 1;
  float lr, mu;
  [[gnu::always_inline]] Next operator()(float w, float g, float v,
                                         float) const {
    const float vi = mu * v + g;
    return {w - lr * vi, vi, 0.0f};
  }
};

struct AdaGradRule {
  static constexpr int kSlots = 1;
  float lr, eps;
  [[gnu::always_inline]] Next operator()(float w, float g, float h,
                                         float) const {
    const float hi = h + g * g;
    return {w - lr * g / (std::sqrt(hi) + eps), hi, 0.0f};
  }
};

// step_size = lr / (1 - b1^t), inv_sqrt_c2 = 1 / sqrt(1 - b2^t): the bias
// corrections hoisted out of the loop (as PyTorch does), leaving one
// division and one square root an element.
struct AdamRule {
  static constexpr int kSlots = 2;
  float b1, b2, eps, step_size, inv_sqrt_c2;
  [[gnu::always_inline]] Next operator()(float w, float g, float m,
                                         float v) const {
    const float mi = b1 * m + (1.0f - b1) * g;
    const float vi = b2 * v + (1.0f - b2) * g * g;
    return {w - step_size * mi / (std::sqrt(vi) * inv_sqrt_c2 + eps), mi, vi};
  }
};

// Nonzero when a value `next` holds for `Rule` is Inf or NaN.
template <typename Rule>
[[gnu::always_inline]] inline uint32_t NonFiniteNext(const Next& next) {
  uint32_t bad = NonFinite(next.w);
  if constexpr (Rule::kSlots > 0) bad |= NonFinite(next.s0);
  if constexpr (Rule::kSlots > 1) bad |= NonFinite(next.s1);
  return bad;
}

// The loops. GCC honours __restrict on function parameters only (on local
// pointers it falls back to run-time alias checks, too many for Adam's
// seven streams, and leaves the loop scalar): hence one pointer per
// stream, each a parameter. Slots a rule does not have are not touched.

// Reads (w, s0, s1), writes the results to (w_out, s0_out, s1_out);
// returns nonzero when one of them is not finite, checked as it is
// written, not in a second pass.
template <typename Rule>
[[gnu::always_inline]] inline uint32_t StepInto(
    size_t n, const float* __restrict w, const float* __restrict g,
    const float* __restrict s0, const float* __restrict s1,
    float* __restrict w_out, float* __restrict s0_out, float* __restrict s1_out,
    Rule rule) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const Next next = rule(w[i], g[i], Rule::kSlots > 0 ? s0[i] : 0.0f,
                           Rule::kSlots > 1 ? s1[i] : 0.0f);
    w_out[i] = next.w;
    if constexpr (Rule::kSlots > 0) s0_out[i] = next.s0;
    if constexpr (Rule::kSlots > 1) s1_out[i] = next.s1;
    bad |= NonFiniteNext<Rule>(next);
  }
  return bad;
}

// Whether a result would not be finite; writes nothing.
template <typename Rule>
[[gnu::always_inline]] inline uint32_t StepWouldFail(
    size_t n, const float* __restrict w, const float* __restrict g,
    const float* __restrict s0, const float* __restrict s1, Rule rule) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bad |= NonFiniteNext<Rule>(rule(w[i], g[i], Rule::kSlots > 0 ? s0[i] : 0.0f,
                                    Rule::kSlots > 1 ? s1[i] : 0.0f));
  }
  return bad;
}

// The results over the inputs; returns the largest AbsBits written.
template <typename Rule>
[[gnu::always_inline]] inline uint32_t StepInPlace(
    size_t n, float* __restrict w, const float* __restrict g,
    float* __restrict s0, float* __restrict s1, Rule rule) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    const Next next = rule(w[i], g[i], Rule::kSlots > 0 ? s0[i] : 0.0f,
                           Rule::kSlots > 1 ? s1[i] : 0.0f);
    w[i] = next.w;
    top = std::max(top, AbsBits(next.w));
    if constexpr (Rule::kSlots > 0) {
      s0[i] = next.s0;
      top = std::max(top, AbsBits(next.s0));
    }
    if constexpr (Rule::kSlots > 1) {
      s1[i] = next.s1;
      top = std::max(top, AbsBits(next.s1));
    }
  }
  return top;
}

// Whether no result of an update can be Inf or NaN when every weight and
// slot is at most `state` in magnitude, every gradient at most `grad`, and
// the second moments (AdaGrad's sums, Adam's v) are not negative (true of
// any a successful update wrote). Each quantity the formulas compute, and
// each result, is bounded from the inputs' bounds; every bound must stay
// far below FLT_MAX (3.4e38), which leaves room for rounding. The
// denominators are at least epsilon, so a zero epsilon, or betas outside
// [0, 1), prove nothing.
bool CannotOverflow(const OptimizerOptions& o, uint64_t step, float lr_scale,
                    double state, double grad) {
  constexpr double kLimit = 1e36;
  const double lr = std::abs(double{o.lr * lr_scale});
  double slot = 0;    // a new slot
  double change = 0;  // a weight's change, and the products on the way
  switch (o.kind) {
    case OptimizerKind::kSgd:
      change = lr * grad;
      break;
    case OptimizerKind::kMomentum:
      slot = std::abs(double{o.momentum}) * state + grad;
      change = lr * slot;
      break;
    case OptimizerKind::kAdaGrad:
      if (!(o.epsilon > 0)) return false;
      slot = state + grad * grad;
      change = std::max(lr * grad, lr * grad / o.epsilon);
      break;
    case OptimizerKind::kAdam: {
      if (!(o.epsilon > 0) || !(o.beta1 >= 0 && o.beta1 < 1) ||
          !(o.beta2 >= 0 && o.beta2 < 1)) {
        return false;
      }
      const double t = static_cast<double>(std::max<uint64_t>(step, 1));
      const double step_size = lr / (1.0 - std::pow(double{o.beta1}, t));
      const double m = o.beta1 * state + (1.0 - o.beta1) * grad;
      const double v = o.beta2 * state + (1.0 - o.beta2) * grad * grad;
      slot = std::max({m, v, grad * grad});
      change = std::max(step_size * m, step_size * m / o.epsilon);
      break;
    }
  }
  const double worst = std::max({state, grad, slot, change, state + change});
  return std::isfinite(worst) && worst * 1.01 < kLimit;
}

// While it lives, this thread's SSE/AVX arithmetic reads subnormal inputs
// as zero and writes subnormal results as zero (x86's DAZ and FTZ bits);
// the caller's setting comes back when it goes. On x86 every operation on
// a subnormal takes a microcode assist, tens of times a normal one's cost,
// and real training makes them: Adam's first moment of a weight whose
// input stays zero for a while (a border pixel) decays by beta1 a step
// through the subnormals towards zero. A tenth of the first moments
// subnormal cost Adam's loop 37% of its speed in tools/bench/apply
// (more where the state is in cache). Elsewhere nothing changes.
class SubnormalsAsZero {
 public:
#if defined(__x86_64__)
  SubnormalsAsZero() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
  }
  ~SubnormalsAsZero() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 0x8000;
  static constexpr unsigned kDenormalsAreZero = 0x0040;
  const unsigned saved_;
#endif
};

// Calls `run` with the rule of the optimizer `o` for an update numbered
// `step` at lr * lr_scale, and returns what it returns.
template <typename Run>
[[gnu::always_inline]] inline uint32_t WithRule(const OptimizerOptions& o,
                                                uint64_t step, float lr_scale,
                                                Run run) {
  const float lr = o.lr * lr_scale;
  switch (o.kind) {
    case OptimizerKind::kSgd:
      return run(SgdRule{lr});
    case OptimizerKind::kMomentum:
      return run(MomentumRule{lr, o.momentum});
    case OptimizerKind::kAdaGrad:
      return run(AdaGradRule{lr, o.epsilon});
    case OptimizerKind::kAdam:
      break;
  }
  // Step 0 would divide by zero below; callers count from 1, so treat a
  // stray 0 as the first step rather than poison the weights with NaN.
  const double t = static_cast<double>(std::max<uint64_t>(step, 1));
  // In double because b^t for large t and b close to 1 loses most of its
  // digits in float; the per-element work stays in float.
  const double c1 = 1.0 - std::pow(double{o.beta1}, t);
  const double c2 = 1.0 - std::pow(double{o.beta2}, t);
  return run(AdamRule{o.beta1, o.beta2, o.epsilon,
                      static_cast<float>(double{lr} / c1),
                      static_cast<float>(1.0 / std::sqrt(c2))});
}

}  // namespace

TETHER_VECTOR_CLONES bool Optimizer::Update(
    std::span<const float> weights, std::span<const float> slots,
    std::span<const float> grad, std::span<float> out_weights,
    std::span<float> out_slots, uint64_t step, float lr_scale) const {
  const size_t n = weights.size();
  assert(grad.size() == n && out_weights.size() == n);
  assert(slots.size() == static_cast<size_t>(slots_per_weight()) * n);
  assert(out_slots.size() == slots.size());
  const float* s = slots.data();
  float* s_out = out_slots.data();
  [[maybe_unused]] const SubnormalsAsZero flush;
  return WithRule(
             options_, step,
             lr_scale, [&](auto rule) __attribute__((always_inline)) {
               return StepInto(n, weights.data(), grad.data(), s,
                               slots.size() > n ? s + n : nullptr,
                               out_weights.data(), s_out,
                               slots.size() > n ? s_out + n : nullptr, rule);
             }) == 0;
}

TETHER_VECTOR_CLONES bool Optimizer::Apply(std::span<float> weights,
                                           std::span<float> slots,
                                           std::span<const float> grad,
                                           uint64_t step, float lr_scale,
                                           float* bound,
                                           float grad_bound) const {
  const size_t n = weights.size();
  assert(grad.size() == n);
  assert(slots.size() == static_cast<size_t>(slots_per_weight()) * n);
  float* s = slots.data();
  float* s1 = slots.size() > n ? s + n : nullptr;
  // When the block's bound and the gradient's largest magnitude prove that
  // no result can overflow, the results are written in one pass; else each
  // is checked before any is written, so that a refused update leaves the
  // inputs as they were.
  const bool proven =
      bound != nullptr && std::isfinite(*bound) &&
      CannotOverflow(options_, step, lr_scale, *bound,
                     std::isfinite(grad_bound)
                         ? grad_bound
                         : MagnitudeOf(MaxAbsBits(n, grad.data())));
  [[maybe_unused]] const SubnormalsAsZero flush;
  uint32_t top = 0;
  const bool refused =
      WithRule(
          options_, step,
          lr_scale, [&](auto rule) __attribute__((always_inline))->uint32_t {
            if (!proven &&
                StepWouldFail(n, weights.data(), grad.data(), s, s1, rule)) {
              return 1;
            }
            top = StepInPlace(n, weights.data(), grad.data(), s, s1, rule);
            return 0;
          }) != 0;
  if (refused) return false;
  // Never above kInfinityBits once proven: Inf, not a NaN's bits, if ever.
  assert(top < kInfinityBits);
  if (bound != nullptr) *bound = MagnitudeOf(top);
  return true;
}

}  // namespace tether
