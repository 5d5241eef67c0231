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

  // Forward only over `rows` rows (any number, in max_batch pieces).
  virtual Result<EvalResult> Evaluate(
      const std::vector<std::vector<float>>& weights, const float* x,
      const int32_t* y, size_t rows) = 0;
};

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
inline constexpr int kFcBackendRevision = 2;

// The backend for `device`.
Result<std::unique_ptr<FcBackend>> MakeFcBackend(const Device& device,
                                                 std::vector<FcLayer> layers,
                                                 int max_batch, int threads);

}  // namespace tether
