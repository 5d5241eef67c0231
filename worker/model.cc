#include "worker/model.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

namespace tether {

size_t ParamSpec::size() const {
  size_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

namespace {

// A stack of fully connected layers whose passes run on an FcBackend; the
// parameters and gradients live here, in host memory, whatever the device.
class FcModel final : public DenseModel {
 public:
  explicit FcModel(std::vector<FcLayer> layers)
      : layers_(std::move(layers)), classes_(layers_.back().out) {}

  // Fills specs_ with `init` per weight (zeros for biases) and gives the
  // local buffers values drawn the same way, so a model also trains alone.
  void InitParams(const std::vector<Init>& weight_inits, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const FcLayer& d = layers_[l];
      specs_.push_back({d.name + ".weight",
                        {uint64_t(d.out), uint64_t(d.in)},
                        weight_inits[l]});
      specs_.push_back({d.name + ".bias", {uint64_t(d.out)}, Init{}});
    }
    for (const ParamSpec& s : specs_) {
      std::vector<float> w(s.size(), 0.0f);
      if (s.init.kind == InitKind::kUniform) {
        std::uniform_real_distribution<float> u(-s.init.scale, s.init.scale);
        for (float& v : w) v = u(rng);
      } else if (s.init.kind == InitKind::kNormal) {
        std::normal_distribution<float> n(0.0f, s.init.scale);
        for (float& v : w) v = n(rng);
      } else if (s.init.kind == InitKind::kConstant) {
        std::fill(w.begin(), w.end(), s.init.scale);
      }
      grads_.emplace_back(w.size(), 0.0f);
      weights_.push_back(std::move(w));
    }
  }

  Status SetBackend(const Device& device, int max_batch, int threads) {
    device_ = device;
    max_batch_ = max_batch;
    threads_ = threads;
    TETHER_ASSIGN_OR_RETURN(auto backend,
                            MakeFcBackend(device, layers_, max_batch, threads));
    backend_ = std::move(backend);
    return Status::Ok();
  }

  std::string device() const override { return backend_->Describe(); }

  Result<std::unique_ptr<DenseModel>> Twin() const override {
    auto twin = std::make_unique<FcModel>(layers_);
    twin->specs_ = specs_;
    twin->weights_ = weights_;
    twin->grads_ = grads_;
    TETHER_RETURN_IF_ERROR(twin->SetBackend(device_, max_batch_, threads_));
    return std::unique_ptr<DenseModel>(std::move(twin));
  }

  using DenseModel::Step;
  Result<float> Step(const float* x, const int32_t* y, int batch,
                     const StepHooks& hooks) override {
    if (batch < 1 || batch > max_batch_) {
      return InvalidArgument("batch " + std::to_string(batch) +
                             " is outside [1, " + std::to_string(max_batch_) +
                             "]");
    }
    TETHER_RETURN_IF_ERROR(CheckLabels(y, size_t(batch)));
    TETHER_RETURN_IF_ERROR(CheckBuffers());
    return backend_->StepWithHooks(weights_, x, y, batch, grads_, hooks);
  }

  Result<EvalResult> Evaluate(const float* x, const int32_t* y,
                              size_t rows) override {
    TETHER_RETURN_IF_ERROR(CheckLabels(y, rows));
    TETHER_RETURN_IF_ERROR(CheckBuffers());
    if (rows == 0) return EvalResult{};
    return backend_->Evaluate(weights_, x, y, rows);
  }

 private:
  Status CheckLabels(const int32_t* y, size_t rows) const {
    for (size_t r = 0; r < rows; ++r) {
      if (y[r] < 0 || y[r] >= classes_) {
        return InvalidArgument("label " + std::to_string(y[r]) + " at row " +
                               std::to_string(r) + " is outside [0, " +
                               std::to_string(classes_) + ")");
      }
    }
    return Status::Ok();
  }

  // weights() is handed out mutable; a resized buffer would be overrun.
  Status CheckBuffers() const {
    if (weights_.size() != specs_.size()) {
      return InvalidArgument(
          "weights() holds " + std::to_string(weights_.size()) +
          " buffers, expected " + std::to_string(specs_.size()));
    }
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (weights_[i].size() != specs_[i].size()) {
        return InvalidArgument("weights() buffer '" + specs_[i].name +
                               "' holds " + std::to_string(weights_[i].size()) +
                               " floats, expected " +
                               std::to_string(specs_[i].size()));
      }
    }
    return Status::Ok();
  }

  const std::vector<FcLayer> layers_;
  const int classes_;
  Device device_;
  int max_batch_ = 0;
  int threads_ = 0;
  std::unique_ptr<FcBackend> backend_;
};

Status CheckCommon(int features, int classes, int max_batch) {
  if (features < 1) {
    return InvalidArgument("features must be >= 1, got " +
                           std::to_string(features));
  }
  if (classes < 2) {
    return InvalidArgument("classes must be >= 2, got " +
                           std::to_string(classes));
  }
  if (max_batch < 1) {
    return InvalidArgument("max_batch must be >= 1, got " +
                           std::to_string(max_batch));
  }
  return Status::Ok();
}

Result<std::unique_ptr<DenseModel>> Finish(std::unique_ptr<FcModel> model,
                                           const Device& device, int max_batch,
                                           int threads) {
  TETHER_RETURN_IF_ERROR(model->SetBackend(device, max_batch, threads));
  return std::unique_ptr<DenseModel>(std::move(model));
}

// Probability of label 1 for logit z and its loss, without overflow.
struct Logistic {
  float p;
  float loss;
};

Logistic LogisticOf(double z, float label) {
  // log(1 + e^z) - y z, written so neither exp can overflow.
  const double softplus = std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z)));
  const double p =
      z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z));
  return {float(p), float(softplus - double(label) * z)};
}

// Keys absent from `keys` count as weight zero (and get no gradient).
double LogitOf(const SparseExample& ex, std::span<const uint64_t> keys,
               std::span<const float> weights, float bias,
               std::vector<ptrdiff_t>* index) {
  double z = bias;
  index->clear();
  const size_t n = std::min(ex.keys.size(), ex.values.size());
  for (size_t j = 0; j < n; ++j) {
    auto it = std::lower_bound(keys.begin(), keys.end(), ex.keys[j]);
    ptrdiff_t i = -1;
    if (it != keys.end() && *it == ex.keys[j] &&
        size_t(it - keys.begin()) < weights.size()) {
      i = it - keys.begin();
      z += double(weights[i]) * ex.values[j];
    }
    index->push_back(i);
  }
  return z;
}

}  // namespace

Result<std::unique_ptr<DenseModel>> MakeSoftmaxRegression(
    int features, int classes, int max_batch, int threads,
    const Device& device) {
  TETHER_RETURN_IF_ERROR(CheckCommon(features, classes, max_batch));
  auto model = std::make_unique<FcModel>(
      std::vector<FcLayer>{{"softmax", features, classes, false}});
  model->InitParams({Init{InitKind::kZeros, 0.0f}}, 1);
  return Finish(std::move(model), device, max_batch, threads);
}

Result<std::unique_ptr<DenseModel>> MakeMlp(int features,
                                            const std::vector<int>& hidden,
                                            int classes, int max_batch,
                                            int threads, const Device& device) {
  TETHER_RETURN_IF_ERROR(CheckCommon(features, classes, max_batch));
  std::vector<FcLayer> layers;
  std::vector<Init> inits;
  int in = features;
  for (size_t i = 0; i <= hidden.size(); ++i) {
    const bool last = i == hidden.size();
    const int out = last ? classes : hidden[i];
    if (out < 1) {
      return InvalidArgument("hidden layer " + std::to_string(i + 1) +
                             " must have >= 1 units, got " +
                             std::to_string(out));
    }
    layers.push_back({"fc" + std::to_string(i + 1), in, out, !last});
    inits.push_back(
        {InitKind::kUniform, float(std::sqrt(6.0 / double(in + out)))});
    in = out;
  }
  auto model = std::make_unique<FcModel>(std::move(layers));
  model->InitParams(inits, 1);
  return Finish(std::move(model), device, max_batch, threads);
}

std::vector<uint64_t> SparseLogisticRegression::UniqueKeys(
    const std::vector<SparseExample>& batch) {
  std::vector<uint64_t> keys;
  for (const SparseExample& ex : batch) {
    keys.insert(keys.end(), ex.keys.begin(), ex.keys.end());
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

float SparseLogisticRegression::Step(const std::vector<SparseExample>& batch,
                                     std::span<const uint64_t> keys,
                                     std::span<const float> weights, float bias,
                                     std::span<float> grad_weights,
                                     float* grad_bias) {
  std::fill(grad_weights.begin(), grad_weights.end(), 0.0f);
  *grad_bias = 0.0f;
  if (batch.empty()) return 0.0f;
  const double inv = 1.0 / double(batch.size());
  double loss = 0;
  double gb = 0;
  std::vector<ptrdiff_t> index;
  for (const SparseExample& ex : batch) {
    const Logistic l =
        LogisticOf(LogitOf(ex, keys, weights, bias, &index), ex.label);
    loss += l.loss;
    const double d = (double(l.p) - ex.label) * inv;
    gb += d;
    for (size_t j = 0; j < index.size(); ++j) {
      if (index[j] >= 0 && size_t(index[j]) < grad_weights.size()) {
        grad_weights[index[j]] += float(d * ex.values[j]);
      }
    }
  }
  *grad_bias = float(gb);
  return float(loss * inv);
}

EvalResult SparseLogisticRegression::Evaluate(
    const std::vector<SparseExample>& batch, std::span<const uint64_t> keys,
    std::span<const float> weights, float bias) {
  EvalResult result;
  std::vector<ptrdiff_t> index;
  for (const SparseExample& ex : batch) {
    const Logistic l =
        LogisticOf(LogitOf(ex, keys, weights, bias, &index), ex.label);
    result.loss_sum += l.loss;
    if ((l.p >= 0.5f) == (ex.label >= 0.5f)) ++result.correct;
    ++result.rows;
  }
  return result;
}

}  // namespace tether
