#include "server/optimizer.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace tether {

Result<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adagrad") return OptimizerKind::kAdaGrad;
  if (name == "adam") return OptimizerKind::kAdam;
  return InvalidArgument("--optimizer: unknown optimizer '" + name +
                         "' (expected sgd, momentum, adagrad or adam)");
}

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdaGrad:
      return "adagrad";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "unknown";
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

void Optimizer::Apply(std::span<float> weights, std::span<float> slots,
                      std::span<const float> grad, uint64_t step,
                      float lr_scale) const {
  const size_t n = weights.size();
  assert(grad.size() == n);
  assert(slots.size() == static_cast<size_t>(slots_per_weight()) * n);
  const float lr = options_.lr * lr_scale;
  float* __restrict w = weights.data();
  const float* __restrict g = grad.data();

  switch (options_.kind) {
    case OptimizerKind::kSgd:
      for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
      return;

    case OptimizerKind::kMomentum: {
      const float mu = options_.momentum;
      float* __restrict v = slots.data();
      for (size_t i = 0; i < n; ++i) {
        v[i] = mu * v[i] + g[i];
        w[i] -= lr * v[i];
      }
      return;
    }

    case OptimizerKind::kAdaGrad: {
      const float eps = options_.epsilon;
      float* __restrict h = slots.data();
      for (size_t i = 0; i < n; ++i) {
        h[i] += g[i] * g[i];
        w[i] -= lr * g[i] / (std::sqrt(h[i]) + eps);
      }
      return;
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
      float* __restrict m = slots.data();
      float* __restrict v = slots.data() + n;
      for (size_t i = 0; i < n; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      }
      return;
    }
  }
}

}  // namespace tether
