// Models a tether-worker trains. A model owns its parameter and gradient
// buffers in host memory; the training loop pulls into weights(), calls
// Step(), and pushes grads(). The parameter names and shapes are what the
// shards store. Dense models compute on a backend (worker/fc_backend.h):
// oneDNN on the CPU with `threads` OpenMP threads, or CUDA on a GPU; the
// model and the loop are the same for both.
//
// Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "schema/status.h"
#include "worker/client.h"
#include "worker/dataset.h"
#include "worker/fc_backend.h"

namespace tether {

struct ParamSpec {
  std::string name;             // e.g. "fc1.weight"
  std::vector<uint64_t> shape;  // row-major
  Init init;                    // how the shards initialise it
  size_t size() const;          // product of shape
};

// A dense classifier over `features` inputs and `classes` outputs trained
// with mean cross-entropy (softmax on the last layer).
class DenseModel {
 public:
  virtual ~DenseModel() = default;

  const std::vector<ParamSpec>& specs() const { return specs_; }
  // One buffer per spec, in the same order and of its size. Step reads
  // the buffers as they are when it reaches each layer (or, on a backend
  // without layer hooks, when it starts): between steps, or in
  // StepHooks::weights_needed for that layer, a buffer may be swapped for
  // another of the same size (one a prefetch filled).
  std::vector<std::vector<float>>& weights() { return weights_; }
  // Written by each Step; between steps a buffer may be swapped for
  // another of the same size (a trainer still sending the last step's
  // gradients from it).
  std::vector<std::vector<float>>& grads() { return grads_; }
  const std::vector<std::vector<float>>& grads() const { return grads_; }

  // Forward and backward on `batch` rows of x (batch * features floats)
  // with labels y in [0, classes): returns the mean cross-entropy loss and
  // fills grads() with its gradient with respect to weights().
  // kInvalidArgument for batch < 1, batch > max_batch or a label out of
  // range; kInternal naming the operation when the backend fails.
  Result<float> Step(const float* x, const int32_t* y, int batch) {
    return Step(x, y, batch, StepHooks{});
  }
  // The same, calling `hooks` as it goes (worker/fc_backend.h): spec i
  // belongs to layer i / 2.
  virtual Result<float> Step(const float* x, const int32_t* y, int batch,
                             const StepHooks& hooks) = 0;

  // Forward only over `rows` rows (any number; done in max_batch pieces).
  virtual Result<EvalResult> Evaluate(const float* x, const int32_t* y,
                                      size_t rows) = 0;

  // Where it computes: "cpu", "cuda:0 (NVIDIA H200)".
  virtual std::string device() const = 0;

  // A model of the same parameters on a backend of its own (the same
  // device and threads), its weights a copy of these: it may Evaluate on
  // another thread while this one trains (worker/background_eval.h).
  // kUnavailable when the device cannot hold a second backend.
  virtual Result<std::unique_ptr<DenseModel>> Twin() const = 0;

 protected:
  std::vector<ParamSpec> specs_;
  std::vector<std::vector<float>> weights_;
  std::vector<std::vector<float>> grads_;
};

// Softmax regression: logits = x W^T + b. Params "softmax.weight"
// [classes, features], "softmax.bias" [classes].
// Both factories: kUnavailable when `device` cannot be used (see
// MakeCudaBackend).
Result<std::unique_ptr<DenseModel>> MakeSoftmaxRegression(
    int features, int classes, int max_batch, int threads,
    const Device& device = {});

// MLP: features -> hidden[0] -> ... -> classes, ReLU between layers. Params
// "fc1.weight" [hidden[0], features], "fc1.bias", "fc2.weight", ... with
// uniform init of scale sqrt(6 / (fan_in + fan_out)) (Glorot) for weights
// and zeros for biases.
Result<std::unique_ptr<DenseModel>> MakeMlp(int features,
                                            const std::vector<int>& hidden,
                                            int classes, int max_batch,
                                            int threads,
                                            const Device& device = {});

// Sparse logistic regression: p = sigmoid(sum_k w[key_k] * value_k + b).
// Weights are rows of width 1 in a sparse table ("sparse_lr.weight"); the
// bias is a dense tensor "sparse_lr.bias" [1].
class SparseLogisticRegression {
 public:
  static constexpr const char* kTable = "sparse_lr.weight";
  static constexpr const char* kBias = "sparse_lr.bias";

  // The distinct keys of `batch`, sorted: the rows to pull and push.
  static std::vector<uint64_t> UniqueKeys(
      const std::vector<SparseExample>& batch);

  // Mean logistic loss over `batch`, given `weights[i]` for `keys[i]` and
  // the bias; fills `grad_weights` (one per key) and `grad_bias`.
  static float Step(const std::vector<SparseExample>& batch,
                    std::span<const uint64_t> keys,
                    std::span<const float> weights, float bias,
                    std::span<float> grad_weights, float* grad_bias);

  // Summed loss and correct predictions (p >= 0.5 vs label) over `batch`.
  static EvalResult Evaluate(const std::vector<SparseExample>& batch,
                             std::span<const uint64_t> keys,
                             std::span<const float> weights, float bias);
};

}  // namespace tether
