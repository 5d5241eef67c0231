#include "server/optimizer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <vector>

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

TETHER_VECTOR_CLONES bool AllFinite(std::span<const float> values) {
  uint32_t bad = 0;
  for (float v : values) {
    bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(v) & 0x7f800000u) ==
                                 0x7f800000u);
  }
  return bad == 0;
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

void Optimizer::Apply(std::span<float> weights, std::span<float> slots,
                      std::span<const float> grad, uint64_t step,
                      float lr_scale) const {
  const std::vector<float> w(weights.begin(), weights.end());
  const std::vector<float> s(slots.begin(), slots.end());
  (void)Update(w, s, grad, weights, slots, step, lr_scale);
}

namespace {

// The loops, one per optimizer, inlined into each clone of Update. GCC
// honours __restrict on function parameters only (on local pointers it
// falls back to run-time alias checks, too many for Adam's seven streams,
// and leaves the loop scalar): hence functions, not blocks of Update.
// `w`/`g`/`s*` are read, `*_out` written; n floats each.

inline void SgdLoop(size_t n, const float* __restrict w,
                    const float* __restrict g, float* __restrict w_out,
                    float lr) {
  for (size_t i = 0; i < n; ++i) w_out[i] = w[i] - lr * g[i];
}

inline void MomentumLoop(size_t n, const float* __restrict w,
                         const float* __restrict g, const float* __restrict v,
                         float* __restrict w_out, float* __restrict v_out,
                         float lr, float mu) {
  for (size_t i = 0; i < n; ++i) {
    const float vi = mu * v[i] + g[i];
    v_out[i] = vi;
    w_out[i] = w[i] - lr * vi;
  }
}

inline void AdaGradLoop(size_t n, const float* __restrict w,
                        const float* __restrict g, const float* __restrict h,
                        float* __restrict w_out, float* __restrict h_out,
                        float lr, float eps) {
  for (size_t i = 0; i < n; ++i) {
    const float hi = h[i] + g[i] * g[i];
    h_out[i] = hi;
    w_out[i] = w[i] - lr * g[i] / (std::sqrt(hi) + eps);
  }
}

// step_size = lr / (1 - b1^t), inv_sqrt_c2 = 1 / sqrt(1 - b2^t): the bias
// corrections hoisted out of the loop (as PyTorch does), leaving one
// division and one square root an element.
inline void AdamLoop(size_t n, const float* __restrict w,
                     const float* __restrict g, const float* __restrict m,
                     const float* __restrict v, float* __restrict w_out,
                     float* __restrict m_out, float* __restrict v_out, float b1,
                     float b2, float eps, float step_size, float inv_sqrt_c2) {
  for (size_t i = 0; i < n; ++i) {
    const float mi = b1 * m[i] + (1.0f - b1) * g[i];
    const float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    m_out[i] = mi;
    v_out[i] = vi;
    w_out[i] = w[i] - step_size * mi / (std::sqrt(vi) * inv_sqrt_c2 + eps);
  }
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

}  // namespace

TETHER_VECTOR_CLONES bool Optimizer::Update(
    std::span<const float> weights, std::span<const float> slots,
    std::span<const float> grad, std::span<float> out_weights,
    std::span<float> out_slots, uint64_t step, float lr_scale) const {
  const size_t n = weights.size();
  assert(grad.size() == n && out_weights.size() == n);
  assert(slots.size() == static_cast<size_t>(slots_per_weight()) * n);
  assert(out_slots.size() == slots.size());
  const float lr = options_.lr * lr_scale;
  const float* w = weights.data();
  const float* g = grad.data();
  float* w_out = out_weights.data();
  const float* s = slots.data();
  float* s_out = out_slots.data();

  [[maybe_unused]] const SubnormalsAsZero flush;
  switch (options_.kind) {
    case OptimizerKind::kSgd:
      SgdLoop(n, w, g, w_out, lr);
      break;
    case OptimizerKind::kMomentum:
      MomentumLoop(n, w, g, s, w_out, s_out, lr, options_.momentum);
      break;
    case OptimizerKind::kAdaGrad:
      AdaGradLoop(n, w, g, s, w_out, s_out, lr, options_.epsilon);
      break;
    case OptimizerKind::kAdam: {
      // Step 0 would divide by zero below; callers count from 1, so treat a
      // stray 0 as the first step rather than poison the weights with NaN.
      const double t = static_cast<double>(std::max<uint64_t>(step, 1));
      // In double because b^t for large t and b close to 1 loses most of its
      // digits in float; the per-element work stays in float.
      const double c1 = 1.0 - std::pow(double{options_.beta1}, t);
      const double c2 = 1.0 - std::pow(double{options_.beta2}, t);
      AdamLoop(n, w, g, s, s + n, w_out, s_out, s_out + n, options_.beta1,
               options_.beta2, options_.epsilon,
               static_cast<float>(double{lr} / c1),
               static_cast<float>(1.0 / std::sqrt(c2)));
      break;
    }
  }
  // A second pass over what was just written, still in cache.
  return AllFinite(out_weights) && AllFinite(out_slots);
}

}  // namespace tether
