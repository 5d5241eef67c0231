// Compute backends for a stack of fully connected layers (ReLU between
// layers, log-softmax cross-entropy at the end): the forward and backward
// passes of tether-worker's dense models, on one device. The models
// (worker/model.h) own the parameters and gradients in host memory and do
// not change per backend; the training loop pulls into the weights, calls
// Step, and pushes the gradients.
//
//   oneDNN (CPU): MakeOneDnnBackend, always built.
//   CUDA (GPU):   MakeCudaBackend, built when CMake finds the CUDA toolkit
//                 (cuBLAS for the layers, small kernels for the rest);
//                 elsewhere it answers kUnavailable.
//
// A backend is not thread-safe; one training loop uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "schema/status.h"

namespace tether {

// One fully connected layer: out = in W^T + b, W [out, in] row-major, b
// [out]; followed by ReLU when `relu` (every layer but the last).
struct FcLayer {
  std::string name;  // "fc1", "softmax": names errors and parameters
  int in = 0;
  int out = 0;
  bool relu = false;
};

struct EvalResult {
  double loss_sum = 0;  // summed cross-entropy over the rows
  int64_t correct = 0;  // rows whose argmax matches the label
  int64_t rows = 0;
};

// Where a model computes: "cpu", "cuda" (device 0) or "cuda:N".
struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;
  std::string ToString() const;  // "cpu", "cuda:0"
};
// kInvalidArgument naming `flag` for anything else.
Result<Device> ParseDevice(const std::string& text, const std::string& flag);

// Where a training loop meets a step in progress, so that the wire works
// while the backend computes. Both may be empty. Layer l's parameters are
// weights[2l] (weight) and weights[2l + 1] (bias), the same in grads.
struct StepHooks {
  // Called before layer l's forward reads its weights (layers in order);
  // e.g. waits for their pull. An error ends the step with it.
  std::function<Status(size_t layer)> weights_needed;
  // Called with the batch's mean loss once forward has it, before any
  // grads_ready; e.g. stops a diverged step (an error ends the step with
  // it) before any of its gradients is sent.
  std::function<Status(float loss)> loss_known;
  // Called once layer l's gradients are final (last layer first); e.g.
  // sends them while backward goes on. They stay unchanged until Step
  // returns.
  std::function<void(size_t layer)> grads_ready;
};

class FcBackend {
 public:
  virtual ~FcBackend() = default;

  // "cpu" or "cuda:N (device name)" for logs and the dashboard.
  virtual std::string Describe() const = 0;

  // Forward and backward over `batch` rows (1..max_batch) of `x` (batch x
  // layers.front().in floats, row-major) with labels `y` (already checked
  // to be in [0, classes)). `weights` and `grads` hold 2 buffers per layer,
  // weight then bias, of the layers' sizes (checked by the caller).
  // Returns the mean cross-entropy and fills `grads` with its gradient.
  // The buffers' addresses stay the same from call to call (a backend may
  // pin them once); kInternal naming the failed call otherwise.
  virtual Result<float> Step(const std::vector<std::vector<float>>& weights,
                             const float* x, const int32_t* y, int batch,
                             std::vector<std::vector<float>>& grads) = 0;
  // Step calling `hooks` as it goes. This default calls weights_needed for
  // every layer first and grads_ready for every layer after the whole
  // step (a device that copies everything at once); the oneDNN backend
  // calls them layer by layer.
  virtual Result<float> StepWithHooks(
      const std::vector<std::vector<float>>& weights, const float* x,
      const int32_t* y, int batch, std::vector<std::vector<float>>& grads,
      const StepHooks& hooks);

  // Forward only over `rows` rows (any number, in max_batch pieces).
  virtual Result<EvalResult> Evaluate(
      const std::vector<std::vector<float>>& weights, const float* x,
      const int32_t* y, size_t rows) = 0;
};

// Inline, like every other member: FcBackend then has no key function, so
// its vtable and type_info are emitted wherever they are used, the CUDA
// module included. With one out of line they lived in the executable only,
// which does not export them, and the module could not be loaded
// ("undefined symbol: _ZTIN6tether9FcBackendE"; found by tools/gpu-check
// on an H200).
inline Result<float> FcBackend::StepWithHooks(
    const std::vector<std::vector<float>>& weights, const float* x,
    const int32_t* y, int batch, std::vector<std::vector<float>>& grads,
    const StepHooks& hooks) {
  const size_t layers = weights.size() / 2;
  if (hooks.weights_needed) {
    for (size_t l = 0; l < layers; ++l) {
      TETHER_RETURN_IF_ERROR(hooks.weights_needed(l));
    }
  }
  TETHER_ASSIGN_OR_RETURN(float loss, Step(weights, x, y, batch, grads));
  if (hooks.loss_known) TETHER_RETURN_IF_ERROR(hooks.loss_known(loss));
  if (hooks.grads_ready) {
    for (size_t l = layers; l-- > 0;) hooks.grads_ready(l);
  }
  return loss;
}

// oneDNN on the CPU with `threads` OpenMP threads (0: OpenMP's default).
Result<std::unique_ptr<FcBackend>> MakeOneDnnBackend(
    std::vector<FcLayer> layers, int max_batch, int threads);

// CUDA device `index`. kInvalidArgument for layers CheckFcLayers refuses
// (checked before CUDA is loaded) and for a last layer with ReLU (the CUDA
// backend takes the loss on the last layer's pre-activations). kUnavailable
// when tether was built without the CUDA toolkit, when the module is found
// but cannot be loaded (a missing cuBLAS, another build's module: says
// which), or when the device does not exist (no GPU, no driver).
Result<std::unique_ptr<FcBackend>> MakeCudaBackend(std::vector<FcLayer> layers,
                                                   int max_batch, int index);

// kInvalidArgument naming the layer when `layers` is empty, a layer has a
// size below 1, a layer's input does not match the previous one's output,
// or max_batch < 1.
Status CheckFcLayers(const std::vector<FcLayer>& layers, int max_batch);

// What the CUDA module and the program loading it must agree on: the
// release and this interface's revision (bump it whenever FcLayer,
// EvalResult, FcBackend or the module's entry point change). The loader
// refuses a module built with another.
inline constexpr int kFcBackendRevision = 4;

// The backend for `device`.
Result<std::unique_ptr<FcBackend>> MakeFcBackend(const Device& device,
                                                 std::vector<FcLayer> layers,
                                                 int max_batch, int threads);

}  // namespace tether
