// Server-side optimizers. A shard applies each pushed gradient to its slice
// of the weights with one of these; the optimizer's state ("slots") lives
// next to the weights it belongs to and is checkpointed with them.
//
// Optimizer is immutable after construction and thread-safe; Apply touches
// only the spans it is given.
#pragma once

#include <boost/describe/class.hpp>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "schema/status.h"

namespace tether {

// The largest magnitude in `values` (0 when empty), or +Inf when any is
// NaN or +-Inf: one scan both checks a push and bounds its gradient for
// Optimizer::Apply. Reads the bits, so it vectorizes and holds under any
// floating-point flags.
float MaxMagnitude(std::span<const float> values);

// The index of the first NaN or +-Inf in `values`, or values.size().
size_t FirstNonFinite(std::span<const float> values);

enum class OptimizerKind { kSgd, kMomentum, kAdaGrad, kAdam };

// "sgd", "momentum", "adagrad" or "adam" -> kind; kInvalidArgument otherwise.
// Inline, with OptimizerName, so that tools that parse the run's flags
// (tether-up) need not link the server.
inline Result<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adagrad") return OptimizerKind::kAdaGrad;
  if (name == "adam") return OptimizerKind::kAdam;
  return InvalidArgument("--optimizer: unknown optimizer '" + name +
                         "' (expected sgd, momentum, adagrad or adam)");
}

inline const char* OptimizerName(OptimizerKind kind) {
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

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;       // learning rate
  float momentum = 0.9f;  // momentum: v = momentum * v + g
  float beta1 = 0.9f;     // adam
  float beta2 = 0.999f;   // adam
  float epsilon = 1e-8f;  // adagrad, adam
};
// Every member, for server/settings_fields.h (which says what each is).
BOOST_DESCRIBE_STRUCT(OptimizerOptions, (),
                      (kind, lr, momentum, beta1, beta2, epsilon))

class Optimizer {
 public:
  explicit Optimizer(OptimizerOptions options) : options_(options) {}

  // Floats of state per weight: sgd 0, momentum 1, adagrad 1, adam 2.
  int slots_per_weight() const;
  const OptimizerOptions& options() const { return options_; }

  // Applies `grad` to `weights` in place (both of length n). `slots` holds
  // slots_per_weight() * n floats, slot-major (slot k of weight i at
  // k * n + i), zero-initialized by the owner. `step` is the 1-based number
  // of updates this block has received including this one (Adam's bias
  // correction). The effective rate is lr * lr_scale.
  //   sgd:      w -= lr * g
  //   momentum: v = momentum * v + g;        w -= lr * v
  //   adagrad:  h += g * g;                  w -= lr * g / (sqrt(h) + eps)
  //   adam:     m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
  //             w -= a * m / (sqrt(v) * r + eps), where a = lr / (1 - b1^t)
  //             and r = 1 / sqrt(1 - b2^t) (PyTorch's hoisted form)
  //
  // Returns false, and writes nothing, when an updated weight or slot would
  // not be finite (an overflow, or a non-finite gradient): every result is
  // computed and checked before any is written, so the inputs are read
  // twice (still cheaper than writing elsewhere: the buffers stay in
  // cache). Subnormal values (below 2^-126, about 1.2e-38) are read and
  // written as zero on x86, where computing with them costs many times
  // more.
  //
  // `bound`, when given, is the caller's record of this block between
  // updates: at least the magnitude of every weight and slot, or +Inf when
  // not known (a new block, one changed any other way). When it and the
  // gradient prove that no result can overflow, the check pass is skipped
  // (each value is read once); after an update it holds the largest
  // magnitude written. `grad_bound`, when finite, is at least the magnitude
  // of every gradient value (MaxMagnitude of `grad` or of more), so the
  // proof need not scan the gradient again; +Inf when not known.
  bool Apply(std::span<float> weights, std::span<float> slots,
             std::span<const float> grad, uint64_t step, float lr_scale = 1.0f,
             float* bound = nullptr,
             float grad_bound = std::numeric_limits<float>::infinity()) const;
  // The same update out of place: reads (weights, slots), writes the
  // updated values to (out_weights, out_slots), which must not overlap
  // them. Returns false when an updated weight or slot is not finite; the
  // outputs then hold no useful values, and the inputs are untouched
  // either way.
  bool Update(std::span<const float> weights, std::span<const float> slots,
              std::span<const float> grad, std::span<float> out_weights,
              std::span<float> out_slots, uint64_t step,
              float lr_scale = 1.0f) const;

 private:
  const OptimizerOptions options_;
};

}  // namespace tether
