// The CUDA (GPU) backend of worker/fc_backend.h, built as the module
// libtether_cuda.so that worker/cuda_loader.cc loads on the first
// --device cuda (so CPU-only processes never load CUDA): cuBLAS for the fully
// connected layers, small grid-stride kernels for bias, ReLU and the
// log-softmax cross-entropy. Every device buffer is allocated once for
// max_batch rows, and so are page-locked host staging buffers that every
// copy goes through (the caller's vectors may be replaced or freed between
// calls; ours stay). Computes what the oneDNN backend computes.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/fc_backend.h"

namespace tether {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

// Accumulated on the device over a step or an evaluation.
struct Scalars {
  double loss_sum;                // summed -log p(label)
  unsigned long long correct;     // rows whose argmax is the label
  unsigned long long bad_labels;  // labels outside [0, classes), skipped
};

int Blocks(size_t n) {
  return int(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ void AddDouble(double* target, double value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 600
  auto* bits = reinterpret_cast<unsigned long long*>(target);
  unsigned long long old = *bits;
  unsigned long long seen;
  do {
    seen = old;
    old = atomicCAS(bits, seen,
                    __double_as_longlong(value + __longlong_as_double(seen)));
  } while (seen != old);
#else
  atomicAdd(target, value);
#endif
}

__global__ void FillKernel(float* p, size_t n, float value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

// z[r, c] += bias[c]; then a = max(z, 0) when `a` is given.
__global__ void BiasReluKernel(float* z, const float* bias, float* a, size_t n,
                               int cols) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float v = z[i] + bias[i % size_t(cols)];
    z[i] = v;
    if (a != nullptr) a[i] = v > 0.0f ? v : 0.0f;
  }
}

// dz = da where z > 0, else 0.
__global__ void ReluBackwardKernel(const float* da, const float* z, float* dz,
                                   size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dz[i] = z[i] > 0.0f ? da[i] : 0.0f;
  }
}

// One thread per row of the logits z [rows, classes]: logp = log_softmax(z)
// (max subtracted first), loss += -logp[y], correct += (argmax logp == y),
// first maximum on ties. When `dz` is given it receives the gradient of the
// mean cross-entropy at the logits, (softmax - onehot) * inv_batch.
__global__ void OutputKernel(const float* z, const int32_t* y, int rows,
                             int classes, float inv_batch, float* dz,
                             Scalars* scalars) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows;
       r += gridDim.x * blockDim.x) {
    const float* zr = z + size_t(r) * classes;
    float max = zr[0];
    for (int c = 1; c < classes; ++c) max = fmaxf(max, zr[c]);
    float sum = 0.0f;
    for (int c = 0; c < classes; ++c) sum += expf(zr[c] - max);
    const float log_sum = logf(sum);
    int best = 0;
    float best_lp = zr[0] - max - log_sum;
    for (int c = 1; c < classes; ++c) {
      const float lp = zr[c] - max - log_sum;
      if (lp > best_lp) {
        best_lp = lp;
        best = c;
      }
    }
    const int32_t label = y[r];
    const bool valid = label >= 0 && label < classes;
    if (dz != nullptr) {
      float* g = dz + size_t(r) * classes;
      for (int c = 0; c < classes; ++c) {
        g[c] = expf(zr[c] - max - log_sum) * inv_batch;
      }
      if (valid) g[label] -= inv_batch;
    }
    if (!valid) {
      atomicAdd(&scalars->bad_labels, 1ull);
      continue;
    }
    AddDouble(&scalars->loss_sum, -double(zr[label] - max - log_sum));
    if (best == label) atomicAdd(&scalars->correct, 1ull);
  }
}

// A device allocation of T, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept
      : p_(std::exchange(other.p_, nullptr)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    std::swap(p_, other.p_);
    return *this;
  }
  ~DeviceArray() {
    if (p_ != nullptr) cudaFree(p_);
  }

  cudaError_t Allocate(size_t n) {
    return cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T));
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

// A page-locked host allocation of T (cudaMallocHost), or pageable memory
// when page-locking fails; freed on destruction.
template <typename T>
class HostArray {
 public:
  HostArray() = default;
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  HostArray(HostArray&& other) noexcept
      : p_(std::exchange(other.p_, nullptr)),
        pinned_(other.pinned_),
        fallback_(std::move(other.fallback_)) {}
  ~HostArray() {
    if (pinned_ && p_ != nullptr) cudaFreeHost(p_);
  }

  // False when the memory is pageable (cudaMallocHost failed: *why says
  // why); copies then still work, synchronously.
  bool Allocate(size_t n, std::string* why) {
    if (cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)) ==
        cudaSuccess) {
      pinned_ = true;
      return true;
    }
    *why = CudaErrorText(cudaGetLastError());
    fallback_ = std::make_unique<T[]>(n);
    p_ = fallback_.get();
    pinned_ = false;
    return false;
  }
  T* get() const { return p_; }

 private:
  static std::string CudaErrorText(cudaError_t e) {
    return cudaGetErrorString(e);
  }
  T* p_ = nullptr;
  bool pinned_ = false;
  std::unique_ptr<T[]> fallback_;
};

// The device buffers of one layer, for max_batch rows.
struct LayerBuffers {
  DeviceArray<float> w, b;    // [out, in], [out]
  DeviceArray<float> z, dz;   // [max_batch, out], pre-activation
  DeviceArray<float> a, da;   // [max_batch, out], ReLU layers only
  DeviceArray<float> dw, db;  // gradients of w and b
  // Host staging of w, b (in) and dw, db (out).
  HostArray<float> host_w, host_b, host_dw, host_db;
};

std::string CudaError(cudaError_t e) { return cudaGetErrorString(e); }

class CudaFcBackend final : public FcBackend {
 public:
  CudaFcBackend(std::vector<FcLayer> layers, int max_batch, int index)
      : layers_(std::move(layers)),
        features_(layers_.front().in),
        classes_(layers_.back().out),
        max_batch_(max_batch),
        index_(index) {}
  CudaFcBackend(const CudaFcBackend&) = delete;
  CudaFcBackend& operator=(const CudaFcBackend&) = delete;

  // Releases whatever Init got to; device buffers free themselves after.
  ~CudaFcBackend() override {
    cudaSetDevice(index_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (host_scalars_ != nullptr) cudaFreeHost(host_scalars_);
  }

  Status Init() {
    const std::string dev = "cuda:" + std::to_string(index_);
    cudaError_t e = cudaSetDevice(index_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Unavailable("--device " + dev +
                         ": cudaSetDevice: " + CudaError(e));
    }
    cudaDeviceProp prop;
    TETHER_RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, index_),
                                 "cudaGetDeviceProperties", dev));
    name_ = prop.name;
    TETHER_RETURN_IF_ERROR(
        Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags", dev));
    TETHER_RETURN_IF_ERROR(
        CheckBlas(cublasCreate(&handle_), "cublasCreate", dev));
    TETHER_RETURN_IF_ERROR(
        CheckBlas(cublasSetStream(handle_, stream_), "cublasSetStream", dev));
    // Plain FP32 (no TF32), as on the CPU.
    TETHER_RETURN_IF_ERROR(
        CheckBlas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH),
                  "cublasSetMathMode", dev));
    TETHER_RETURN_IF_ERROR(
        Check(cudaMallocHost(reinterpret_cast<void**>(&host_scalars_),
                             sizeof(Scalars)),
              "cudaMallocHost", dev));

    const size_t rows = size_t(max_batch_);
    TETHER_RETURN_IF_ERROR(
        Check(x_.Allocate(rows * features_), "cudaMalloc", "input"));
    TETHER_RETURN_IF_ERROR(Check(y_.Allocate(rows), "cudaMalloc", "input"));
    TETHER_RETURN_IF_ERROR(Check(ones_.Allocate(rows), "cudaMalloc", dev));
    TETHER_RETURN_IF_ERROR(Check(scalars_.Allocate(1), "cudaMalloc", dev));
    buffers_.resize(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const FcLayer& d = layers_[l];
      LayerBuffers& B = buffers_[l];
      const size_t params = size_t(d.out) * d.in;
      const size_t act = rows * d.out;
      const std::string layer = "layer " + d.name;
      using Alloc = std::pair<DeviceArray<float>*, size_t>;
      std::vector<Alloc> allocs = {
          {&B.w, params},         {&B.dw, params}, {&B.b, size_t(d.out)},
          {&B.db, size_t(d.out)}, {&B.z, act},     {&B.dz, act}};
      if (d.relu) {
        allocs.push_back({&B.a, act});
        allocs.push_back({&B.da, act});
      }
      for (const auto& [array, n] : allocs) {
        TETHER_RETURN_IF_ERROR(Check(array->Allocate(n), "cudaMalloc", layer));
      }
      StageOnHost(&B.host_w, params);
      StageOnHost(&B.host_dw, params);
      StageOnHost(&B.host_b, size_t(d.out));
      StageOnHost(&B.host_db, size_t(d.out));
    }
    StageOnHost(&host_x_, rows * features_);
    StageOnHost(&host_y_, rows);
    FillKernel<<<Blocks(rows), kThreads, 0, stream_>>>(ones_.get(), rows, 1.0f);
    TETHER_RETURN_IF_ERROR(Check(cudaGetLastError(), "FillKernel", dev));
    return Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", dev);
  }

  // Says whether the host staging buffers are page-locked.
  std::string Describe() const override {
    return "cuda:" + std::to_string(index_) + " (" + name_ + ", " +
           (pageable_why_.empty()
                ? std::string("page-locked host buffers")
                : "pageable host buffers: cudaMallocHost: " + pageable_why_) +
           ")";
  }

  Result<float> Step(const std::vector<std::vector<float>>& weights,
                     const float* x, const int32_t* y, int batch,
                     std::vector<std::vector<float>>& grads) override {
    return Drained(StepOnStream(weights, x, y, batch, grads));
  }

  Result<EvalResult> Evaluate(const std::vector<std::vector<float>>& weights,
                              const float* x, const int32_t* y,
                              size_t rows) override {
    return Drained(EvaluateOnStream(weights, x, y, rows));
  }

 private:
  // A failed call leaves nothing in flight: the stream is waited for (so
  // no copy still reads or writes the caller's buffers, or ours) and the
  // runtime's last error cleared, so the next call does not inherit it.
  template <typename T>
  T Drained(T result) {
    if (!result.ok()) {
      cudaStreamSynchronize(stream_);
      cudaGetLastError();
    }
    return result;
  }

  Result<float> StepOnStream(const std::vector<std::vector<float>>& weights,
                             const float* x, const int32_t* y, int batch,
                             std::vector<std::vector<float>>& grads) {
    // An error an earlier call left behind is not this step's.
    cudaGetLastError();
    if (batch < 1 || batch > max_batch_) {
      return InvalidArgument("batch " + std::to_string(batch) +
                             " is outside [1, " + std::to_string(max_batch_) +
                             "]");
    }
    TETHER_RETURN_IF_ERROR(CheckSizes(weights, "weights"));
    TETHER_RETURN_IF_ERROR(CheckSizes(grads, "grads"));
    TETHER_RETURN_IF_ERROR(Check(cudaSetDevice(index_), "cudaSetDevice",
                                 "cuda:" + std::to_string(index_)));

    TETHER_RETURN_IF_ERROR(
        Check(cudaMemsetAsync(scalars_.get(), 0, sizeof(Scalars), stream_),
              "cudaMemsetAsync", "layer output"));
    TETHER_RETURN_IF_ERROR(CopyWeights(weights));
    TETHER_RETURN_IF_ERROR(CopyInput(x, y, batch));
    TETHER_RETURN_IF_ERROR(Forward(batch));
    TETHER_RETURN_IF_ERROR(Output(batch, buffers_.back().dz.get()));
    TETHER_RETURN_IF_ERROR(Backward(batch));

    for (size_t l = 0; l < layers_.size(); ++l) {
      const std::string layer = "layer " + layers_[l].name;
      LayerBuffers& B = buffers_[l];
      TETHER_RETURN_IF_ERROR(
          ToHost(B.host_dw.get(), B.dw.get(), grads[2 * l].size(), layer));
      TETHER_RETURN_IF_ERROR(
          ToHost(B.host_db.get(), B.db.get(), grads[2 * l + 1].size(), layer));
    }
    TETHER_RETURN_IF_ERROR(FinishScalars());  // waits for the stream
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerBuffers& B = buffers_[l];
      std::memcpy(grads[2 * l].data(), B.host_dw.get(),
                  grads[2 * l].size() * sizeof(float));
      std::memcpy(grads[2 * l + 1].data(), B.host_db.get(),
                  grads[2 * l + 1].size() * sizeof(float));
    }
    return float(host_scalars_->loss_sum / batch);
  }

  Result<EvalResult> EvaluateOnStream(
      const std::vector<std::vector<float>>& weights, const float* x,
      const int32_t* y, size_t rows) {
    cudaGetLastError();
    EvalResult result;
    if (rows == 0) return result;
    TETHER_RETURN_IF_ERROR(CheckSizes(weights, "weights"));
    TETHER_RETURN_IF_ERROR(Check(cudaSetDevice(index_), "cudaSetDevice",
                                 "cuda:" + std::to_string(index_)));

    TETHER_RETURN_IF_ERROR(
        Check(cudaMemsetAsync(scalars_.get(), 0, sizeof(Scalars), stream_),
              "cudaMemsetAsync", "layer output"));
    TETHER_RETURN_IF_ERROR(CopyWeights(weights));
    for (size_t start = 0; start < rows; start += size_t(max_batch_)) {
      const int n = int(std::min(rows - start, size_t(max_batch_)));
      if (start > 0) {
        // The staging buffer is about to be refilled: the last piece's
        // copy out of it must be done.
        TETHER_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_),
                                     "cudaStreamSynchronize", "input"));
      }
      TETHER_RETURN_IF_ERROR(
          CopyInput(x + start * size_t(features_), y + start, n));
      TETHER_RETURN_IF_ERROR(Forward(n));
      TETHER_RETURN_IF_ERROR(Output(n, nullptr));
    }
    TETHER_RETURN_IF_ERROR(FinishScalars());
    result.loss_sum = host_scalars_->loss_sum;
    result.correct = int64_t(host_scalars_->correct);
    result.rows = int64_t(rows);
    return result;
  }

  // `subject`: "layer fc1", "input", "cuda:0".
  static Status Check(cudaError_t e, const char* call,
                      const std::string& subject) {
    if (e == cudaSuccess) return Status::Ok();
    return Internal(std::string("CUDA ") + call + " for " + subject + ": " +
                    CudaError(e) +
                    " (CUDA reports errors of asynchronous work late: it may "
                    "come from an earlier operation on this stream)");
  }

  static Status CheckBlas(cublasStatus_t s, const char* call,
                          const std::string& subject) {
    if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
    return Internal(std::string("CUDA ") + call + " for " + subject +
                    ": cuBLAS status " + std::to_string(int(s)) + " (" +
                    cublasGetStatusName(s) + ")");
  }

  // The caller checks these; a wrong size here would overrun a device copy.
  Status CheckSizes(const std::vector<std::vector<float>>& buffers,
                    const char* what) const {
    if (buffers.size() != 2 * layers_.size()) {
      return InvalidArgument(
          std::string(what) + " holds " + std::to_string(buffers.size()) +
          " buffers, expected " + std::to_string(2 * layers_.size()));
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const FcLayer& d = layers_[l];
      if (buffers[2 * l].size() != size_t(d.out) * d.in ||
          buffers[2 * l + 1].size() != size_t(d.out)) {
        return InvalidArgument(std::string(what) + " for layer " + d.name +
                               " do not match [" + std::to_string(d.out) +
                               ", " + std::to_string(d.in) + "]");
      }
    }
    return Status::Ok();
  }

  // Page-locked staging for a host buffer of n floats; pageable memory,
  // remembered for Describe, when page-locking fails.
  template <typename T>
  void StageOnHost(HostArray<T>* array, size_t n) {
    std::string why;
    if (!array->Allocate(n, &why) && pageable_why_.empty()) {
      pageable_why_ = why;
    }
  }

  Status ToDevice(float* dst, const float* src, size_t n,
                  const std::string& subject) {
    return Check(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync", subject);
  }

  Status ToHost(float* dst, const float* src, size_t n,
                const std::string& subject) {
    return Check(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_),
                 "cudaMemcpyAsync", subject);
  }

  Status CopyWeights(const std::vector<std::vector<float>>& weights) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      const std::string layer = "layer " + layers_[l].name;
      LayerBuffers& B = buffers_[l];
      std::memcpy(B.host_w.get(), weights[2 * l].data(),
                  weights[2 * l].size() * sizeof(float));
      std::memcpy(B.host_b.get(), weights[2 * l + 1].data(),
                  weights[2 * l + 1].size() * sizeof(float));
      TETHER_RETURN_IF_ERROR(
          ToDevice(B.w.get(), B.host_w.get(), weights[2 * l].size(), layer));
      TETHER_RETURN_IF_ERROR(ToDevice(B.b.get(), B.host_b.get(),
                                      weights[2 * l + 1].size(), layer));
    }
    return Status::Ok();
  }

  // Through the staging buffers, whose previous contents the stream no
  // longer reads (callers wait for it between uses).
  Status CopyInput(const float* x, const int32_t* y, int rows) {
    std::memcpy(host_x_.get(), x, size_t(rows) * features_ * sizeof(float));
    std::memcpy(host_y_.get(), y, size_t(rows) * sizeof(int32_t));
    TETHER_RETURN_IF_ERROR(
        ToDevice(x_.get(), host_x_.get(), size_t(rows) * features_, "input"));
    return Check(
        cudaMemcpyAsync(y_.get(), host_y_.get(), size_t(rows) * sizeof(int32_t),
                        cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync", "input");
  }

  // The rows x in input of layer l: x, or the previous layer's output.
  const float* Input(size_t l) const {
    if (l == 0) return x_.get();
    const LayerBuffers& prev = buffers_[l - 1];
    return layers_[l - 1].relu ? prev.a.get() : prev.z.get();
  }

  // cuBLAS is column-major: a row-major matrix M [r x c] is, to cuBLAS, the
  // column-major M^T [c x r] with leading dimension c. So Z = X W^T becomes
  // Z^T = W X^T (W^T [in x out] transposed, X^T [in x batch]), and so on.
  Status Forward(int batch) {
    const float one = 1.0f;
    const float zero = 0.0f;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const FcLayer& d = layers_[l];
      LayerBuffers& B = buffers_[l];
      const std::string layer = "layer " + d.name;
      // Z [batch x out] = X [batch x in] W^T.
      TETHER_RETURN_IF_ERROR(
          CheckBlas(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, d.out, batch,
                                d.in, &one, B.w.get(), d.in, Input(l), d.in,
                                &zero, B.z.get(), d.out),
                    "cublasSgemm (forward)", layer));
      const size_t n = size_t(batch) * d.out;
      BiasReluKernel<<<Blocks(n), kThreads, 0, stream_>>>(
          B.z.get(), B.b.get(), d.relu ? B.a.get() : nullptr, n, d.out);
      TETHER_RETURN_IF_ERROR(
          Check(cudaGetLastError(), "BiasReluKernel", layer));
    }
    return Status::Ok();
  }

  // Loss (and with `dz`, its gradient) at the last layer's logits.
  Status Output(int batch, float* dz) {
    OutputKernel<<<Blocks(size_t(batch)), kThreads, 0, stream_>>>(
        buffers_.back().z.get(), y_.get(), batch, classes_, 1.0f / float(batch),
        dz, scalars_.get());
    return Check(cudaGetLastError(), "OutputKernel", "layer output");
  }

  // Expects the last layer's dz filled with the gradient at the logits.
  Status Backward(int batch) {
    const float one = 1.0f;
    const float zero = 0.0f;
    for (size_t l = layers_.size(); l-- > 0;) {
      const FcLayer& d = layers_[l];
      LayerBuffers& B = buffers_[l];
      const std::string layer = "layer " + d.name;
      // dW [out x in] = dZ^T X, i.e. dW^T = X^T dZ.
      TETHER_RETURN_IF_ERROR(
          CheckBlas(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, d.in, d.out,
                                batch, &one, Input(l), d.in, B.dz.get(), d.out,
                                &zero, B.dw.get(), d.in),
                    "cublasSgemm (weight gradient)", layer));
      // db [out] = column sums of dZ = dZ^T ones.
      TETHER_RETURN_IF_ERROR(CheckBlas(
          cublasSgemv(handle_, CUBLAS_OP_N, d.out, batch, &one, B.dz.get(),
                      d.out, ones_.get(), 1, &zero, B.db.get(), 1),
          "cublasSgemv (bias gradient)", layer));
      if (l == 0) break;
      // dA_prev [batch x in] = dZ W, i.e. dA_prev^T = W^T dZ^T.
      const FcLayer& pd = layers_[l - 1];
      LayerBuffers& prev = buffers_[l - 1];
      float* da = pd.relu ? prev.da.get() : prev.dz.get();
      TETHER_RETURN_IF_ERROR(
          CheckBlas(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, d.in, batch,
                                d.out, &one, B.w.get(), d.in, B.dz.get(), d.out,
                                &zero, da, d.in),
                    "cublasSgemm (input gradient)", layer));
      if (pd.relu) {
        const size_t n = size_t(batch) * pd.out;
        ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream_>>>(
            prev.da.get(), prev.z.get(), prev.dz.get(), n);
        TETHER_RETURN_IF_ERROR(Check(cudaGetLastError(), "ReluBackwardKernel",
                                     "layer " + pd.name));
      }
    }
    return Status::Ok();
  }

  // Copies the scalars back and waits for the stream.
  Status FinishScalars() {
    TETHER_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(host_scalars_, scalars_.get(), sizeof(Scalars),
                              cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpyAsync", "layer output"));
    TETHER_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_),
                                 "cudaStreamSynchronize", "layer output"));
    if (host_scalars_->bad_labels != 0) {
      return InvalidArgument(std::to_string(host_scalars_->bad_labels) +
                             " labels are outside [0, " +
                             std::to_string(classes_) + ")");
    }
    return Status::Ok();
  }

  // Constant after construction.
  const std::vector<FcLayer> layers_;
  const int features_;
  const int classes_;
  const int max_batch_;
  const int index_;
  std::string name_;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  Scalars* host_scalars_ = nullptr;  // pinned
  DeviceArray<float> x_;             // [max_batch, features]
  DeviceArray<int32_t> y_;           // [max_batch]
  DeviceArray<float> ones_;          // [max_batch] of 1, for bias gradients
  DeviceArray<Scalars> scalars_;
  std::vector<LayerBuffers> buffers_;  // per layer

  HostArray<float> host_x_;    // staging of x
  HostArray<int32_t> host_y_;  // staging of y
  std::string pageable_why_;   // "" when all staging is page-locked
};

}  // namespace

Result<std::unique_ptr<FcBackend>> MakeCudaBackendHere(
    std::vector<FcLayer> layers, int max_batch, int index) {
  // The loader (worker/cuda_loader.cc) checked the layers and the index.
  const std::string dev = "--device cuda:" + std::to_string(index);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Unavailable(
        dev + ": no CUDA device (cudaGetDeviceCount: " + CudaError(e) + ")");
  }
  if (count == 0) {
    return Unavailable(dev + ": no CUDA device (cudaGetDeviceCount: 0)");
  }
  if (index >= count) {
    return Unavailable(dev + ": no such device (" + std::to_string(count) +
                       " CUDA device" + (count == 1 ? "" : "s") + ")");
  }
  auto backend =
      std::make_unique<CudaFcBackend>(std::move(layers), max_batch, index);
  TETHER_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<FcBackend>(std::move(backend));
}

}  // namespace tether

// What the loader compares with its own before using this module.
extern "C" const char* tether_cuda_module_version() {
  static const std::string version = std::string(TETHER_VERSION) + "/fc" +
                                     std::to_string(tether::kFcBackendRevision);
  return version.c_str();
}

// The entry point worker/cuda_loader.cc looks up after loading this module.
extern "C" void tether_make_cuda_backend(
    const tether::FcLayer* layers, size_t count, int max_batch, int index,
    tether::Result<std::unique_ptr<tether::FcBackend>>* out) {
  // (void): the assignment's Result& is not a result to check.
  static_cast<void>(*out = tether::MakeCudaBackendHere(
                        std::vector<tether::FcLayer>(layers, layers + count),
                        max_batch, index));
}
