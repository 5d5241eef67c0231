#include "server/optimizer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <vector>

// The shard's arithmetic hot path: the update loops and the finiteness
// scan are built twice, for x86-64's baseline (SSE2) and for AVX2, and the
// loader picks one by the CPU. Both do the same IEEE operations in the same
// order (no FMA contraction, no reassociation), so a shard's weights are
// bit-identical whichever runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define TETHER_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TETHER_VECTOR_CLONES
#endif

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

TETHER_VECTOR_CLONES bool Optimizer::Update(
    std::span<const float> weights, std::span<const float> slots,
    std::span<const float> grad, std::span<float> out_weights,
    std::span<float> out_slots, uint64_t step, float lr_scale) const {
  const size_t n = weights.size();
  assert(grad.size() == n && out_weights.size() == n);
  assert(slots.size() == static_cast<size_t>(slots_per_weight()) * n);
  assert(out_slots.size() == slots.size());
  const float lr = options_.lr * lr_scale;
  const float* __restrict w = weights.data();
  const float* __restrict g = grad.data();
  float* __restrict w_out = out_weights.data();

  switch (options_.kind) {
    case OptimizerKind::kSgd:
      for (size_t i = 0; i < n; ++i) w_out[i] = w[i] - lr * g[i];
      break;

    case OptimizerKind::kMomentum: {
      const float mu = options_.momentum;
      const float* __restrict v = slots.data();
      float* __restrict v_out = out_slots.data();
      for (size_t i = 0; i < n; ++i) {
        const float vi = mu * v[i] + g[i];
        v_out[i] = vi;
        w_out[i] = w[i] - lr * vi;
      }
      break;
    }

    case OptimizerKind::kAdaGrad: {
      const float eps = options_.epsilon;
      const float* __restrict h = slots.data();
      float* __restrict h_out = out_slots.data();
      for (size_t i = 0; i < n; ++i) {
        const float hi = h[i] + g[i] * g[i];
        h_out[i] = hi;
        w_out[i] = w[i] - lr * g[i] / (std::sqrt(hi) + eps);
      }
      break;
    }

    case OptimizerKind::kAdam: {
      const float b1 = options_.beta1;
      const float b2 = options_.beta2;
      const float eps = options_.epsilon;
      // Step 0 would divide by zero below; callers count from 1, so treat a
      // stray 0 as the first step rather than poison the weights with NaN.
      const double t = static_cast<double>(std::max<uint64_t>(step, 1));
      // In double because b^t for large t and b close to 1 loses most of its
      // digits in float; the per-element work stays in float.
      const float c1 = static_cast<float>(1.0 - std::pow(double{b1}, t));
      const float c2 = static_cast<float>(1.0 - std::pow(double{b2}, t));
      const float* __restrict m = slots.data();
      const float* __restrict v = slots.data() + n;
      float* __restrict m_out = out_slots.data();
      float* __restrict v_out = out_slots.data() + n;
      for (size_t i = 0; i < n; ++i) {
        const float mi = b1 * m[i] + (1.0f - b1) * g[i];
        const float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        m_out[i] = mi;
        v_out[i] = vi;
        w_out[i] = w[i] - lr * (mi / c1) / (std::sqrt(vi / c2) + eps);
      }
      break;
    }
  }
  // A second pass over what was just written, still in cache.
  return AllFinite(out_weights) && AllFinite(out_slots);
}

}  // namespace tether
