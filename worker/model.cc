#include "worker/model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <unordered_map>
#include <utility>

#include "oneapi/dnnl/dnnl.hpp"

namespace tether {

size_t ParamSpec::size() const {
  size_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Args = std::unordered_map<int, memory>;

constexpr memory::data_type kF32 = memory::data_type::f32;
// Plans kept besides the one for max_batch; a training loop sees at most
// two batch sizes (full and the last partial), evaluation one more.
constexpr size_t kMaxExtraPlans = 4;

// A fully connected layer; every layer but the last is followed by ReLU.
struct LayerDef {
  std::string name;  // "fc1", "softmax"
  int in = 0;
  int out = 0;
  bool relu = false;
};

// The primitives and activation buffers for one batch size. Parameters and
// inputs are bound per call, so the caller may replace weights() buffers.
struct Plan {
  struct Layer {
    dnnl::inner_product_forward fwd;
    dnnl::inner_product_backward_data bwd_data;  // not for the first layer
    dnnl::inner_product_backward_weights bwd_weights;
    dnnl::eltwise_forward relu_fwd;
    dnnl::eltwise_backward relu_bwd;
    memory::desc src_md, weights_md, bias_md, dst_md;
    std::vector<float> z, a, dz, da;  // pre/post activation and their diffs
    memory z_mem, a_mem, dz_mem, da_mem;
  };
  int batch = 0;
  std::vector<Layer> layers;
  dnnl::logsoftmax_forward logsoftmax;
  std::vector<float> logp;  // batch x classes
  memory logp_mem;
};

// Wraps a buffer owned elsewhere; oneDNN never writes through inputs.
memory Wrap(const memory::desc& md, const dnnl::engine& engine,
            const float* data) {
  return memory(md, engine, const_cast<float*>(data));
}

class FcModel final : public DenseModel {
 public:
  FcModel(std::vector<LayerDef> layers, int max_batch, int threads)
      : layers_(std::move(layers)),
        features_(layers_.front().in),
        classes_(layers_.back().out),
        max_batch_(max_batch),
        threads_(threads),
        engine_(MakeEngine(threads)),
        stream_(engine_) {}

  // oneDNN sizes its kernels for the OpenMP thread count in force when a
  // primitive is created, so that count is set before anything is built;
  // otherwise a 1-thread worker keeps a second OpenMP thread spinning.
  static dnnl::engine MakeEngine(int threads) {
    if (threads > 0) {
      omp_set_dynamic(0);
      omp_set_num_threads(threads);
    }
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }

  // Fills specs_ with `init` per weight (zeros for biases) and gives the
  // local buffers values drawn the same way, so a model also trains alone.
  void InitParams(const std::vector<Init>& weight_inits, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerDef& d = layers_[l];
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

  Status Prepare() { return GetPlan(max_batch_).status(); }

  Result<float> Step(const float* x, const int32_t* y, int batch) override {
    if (batch < 1 || batch > max_batch_) {
      return InvalidArgument("batch " + std::to_string(batch) +
                             " is outside [1, " + std::to_string(max_batch_) +
                             "]");
    }
    TETHER_RETURN_IF_ERROR(CheckLabels(y, size_t(batch)));
    TETHER_RETURN_IF_ERROR(CheckBuffers());
    if (threads_ > 0) omp_set_num_threads(threads_);
    Result<Plan*> plan = GetPlan(batch);
    if (!plan.ok()) return plan.status();
    Plan& p = **plan;
    TETHER_RETURN_IF_ERROR(Forward(p, x));

    // Cross-entropy gradient at the logits: (softmax - onehot) / batch.
    Plan::Layer& last = p.layers.back();
    double loss = 0;
    const float inv = 1.0f / float(batch);
    for (int r = 0; r < batch; ++r) {
      const float* lp = &p.logp[size_t(r) * classes_];
      float* g = &last.dz[size_t(r) * classes_];
      for (int c = 0; c < classes_; ++c) g[c] = std::exp(lp[c]) * inv;
      g[y[r]] -= inv;
      loss -= lp[y[r]];
    }
    TETHER_RETURN_IF_ERROR(Backward(p, x));
    TETHER_RETURN_IF_ERROR(Wait());
    return float(loss / batch);
  }

  Result<EvalResult> Evaluate(const float* x, const int32_t* y,
                              size_t rows) override {
    TETHER_RETURN_IF_ERROR(CheckLabels(y, rows));
    TETHER_RETURN_IF_ERROR(CheckBuffers());
    if (threads_ > 0) omp_set_num_threads(threads_);
    EvalResult result;
    for (size_t start = 0; start < rows; start += size_t(max_batch_)) {
      const int n = int(std::min(rows - start, size_t(max_batch_)));
      Result<Plan*> plan = GetPlan(n);
      if (!plan.ok()) return plan.status();
      Plan& p = **plan;
      TETHER_RETURN_IF_ERROR(Forward(p, x + start * features_));
      TETHER_RETURN_IF_ERROR(Wait());
      for (int r = 0; r < n; ++r) {
        const float* lp = &p.logp[size_t(r) * classes_];
        const int32_t label = y[start + r];
        result.loss_sum -= lp[label];
        if (std::max_element(lp, lp + classes_) - lp == label) {
          ++result.correct;
        }
      }
      result.rows += n;
    }
    return result;
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

  Result<Plan*> GetPlan(int batch) {
    auto it = plans_.find(batch);
    if (it != plans_.end()) return it->second.get();
    if (plans_.size() > kMaxExtraPlans) {
      for (auto e = plans_.begin(); e != plans_.end(); ++e) {
        if (e->first != max_batch_) {
          plans_.erase(e);
          break;
        }
      }
    }
    auto plan = std::make_unique<Plan>();
    TETHER_RETURN_IF_ERROR(Build(batch, plan.get()));
    Plan* raw = plan.get();
    plans_.emplace(batch, std::move(plan));
    return raw;
  }

  Status Build(int batch, Plan* p) {
    const char* what = "";
    std::string layer;
    try {
      p->batch = batch;
      const memory::dim n = batch;
      for (size_t l = 0; l < layers_.size(); ++l) {
        const LayerDef& d = layers_[l];
        layer = d.name;
        Plan::Layer& L = p->layers.emplace_back();
        L.src_md = memory::desc({n, d.in}, kF32, Tag::nc);
        L.weights_md = memory::desc({d.out, d.in}, kF32, Tag::oi);
        L.bias_md = memory::desc({d.out}, kF32, Tag::x);
        L.dst_md = memory::desc({n, d.out}, kF32, Tag::nc);
        const size_t act = size_t(batch) * d.out;
        L.z.assign(act, 0.0f);
        L.dz.assign(act, 0.0f);
        L.z_mem = memory(L.dst_md, engine_, L.z.data());
        L.dz_mem = memory(L.dst_md, engine_, L.dz.data());

        what = "inner_product_forward";
        dnnl::inner_product_forward::primitive_desc fwd_pd(
            {dnnl::prop_kind::forward_training, L.src_md, L.weights_md,
             L.bias_md, L.dst_md},
            engine_);
        L.fwd = dnnl::inner_product_forward(fwd_pd);
        what = "inner_product_backward_weights";
        L.bwd_weights = dnnl::inner_product_backward_weights(
            {{L.src_md, L.weights_md, L.bias_md, L.dst_md}, engine_, fwd_pd});
        if (l > 0) {
          what = "inner_product_backward_data";
          L.bwd_data = dnnl::inner_product_backward_data(
              {{L.src_md, L.weights_md, L.dst_md}, engine_, fwd_pd});
        }
        if (d.relu) {
          L.a.assign(act, 0.0f);
          L.da.assign(act, 0.0f);
          L.a_mem = memory(L.dst_md, engine_, L.a.data());
          L.da_mem = memory(L.dst_md, engine_, L.da.data());
          what = "eltwise_forward (relu)";
          dnnl::eltwise_forward::primitive_desc relu_pd(
              {dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu,
               L.dst_md, 0.0f},
              engine_);
          L.relu_fwd = dnnl::eltwise_forward(relu_pd);
          what = "eltwise_backward (relu)";
          L.relu_bwd = dnnl::eltwise_backward(
              {{dnnl::algorithm::eltwise_relu, L.dst_md, L.dst_md, 0.0f},
               engine_,
               relu_pd});
        }
      }
      layer = "output";
      what = "logsoftmax_forward";
      const memory::desc& out_md = p->layers.back().dst_md;
      p->logsoftmax = dnnl::logsoftmax_forward(
          {{dnnl::prop_kind::forward_training, out_md, 1}, engine_});
      p->logp.assign(size_t(batch) * classes_, 0.0f);
      p->logp_mem = memory(out_md, engine_, p->logp.data());
    } catch (const dnnl::error& e) {
      return Internal("oneDNN " + std::string(what) + " for layer " + layer +
                      " (batch " + std::to_string(batch) + "): " + e.what());
    }
    return Status::Ok();
  }

  Status Run(dnnl::primitive& prim, const Args& args, const char* what,
             const std::string& layer) {
    try {
      prim.execute(stream_, args);
    } catch (const dnnl::error& e) {
      return Internal("oneDNN " + std::string(what) + " for layer " + layer +
                      ": " + e.what());
    }
    return Status::Ok();
  }

  Status Wait() {
    try {
      stream_.wait();
    } catch (const dnnl::error& e) {
      return Internal(std::string("oneDNN stream wait: ") + e.what());
    }
    return Status::Ok();
  }

  Status Forward(Plan& p, const float* x) {
    memory src = Wrap(p.layers.front().src_md, engine_, x);
    for (size_t l = 0; l < layers_.size(); ++l) {
      Plan::Layer& L = p.layers[l];
      const std::string& name = layers_[l].name;
      TETHER_RETURN_IF_ERROR(
          Run(L.fwd,
              {{DNNL_ARG_SRC, src},
               {DNNL_ARG_WEIGHTS,
                Wrap(L.weights_md, engine_, weights_[2 * l].data())},
               {DNNL_ARG_BIAS,
                Wrap(L.bias_md, engine_, weights_[2 * l + 1].data())},
               {DNNL_ARG_DST, L.z_mem}},
              "inner_product_forward", name));
      src = L.z_mem;
      if (layers_[l].relu) {
        TETHER_RETURN_IF_ERROR(
            Run(L.relu_fwd, {{DNNL_ARG_SRC, L.z_mem}, {DNNL_ARG_DST, L.a_mem}},
                "eltwise_forward (relu)", name));
        src = L.a_mem;
      }
    }
    return Run(p.logsoftmax, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, p.logp_mem}},
               "logsoftmax_forward", "output");
  }

  // Expects the last layer's dz filled with the gradient at the logits.
  Status Backward(Plan& p, const float* x) {
    for (size_t l = layers_.size(); l-- > 0;) {
      Plan::Layer& L = p.layers[l];
      const std::string& name = layers_[l].name;
      memory src = l == 0 ? Wrap(L.src_md, engine_, x) : p.layers[l - 1].a_mem;
      TETHER_RETURN_IF_ERROR(
          Run(L.bwd_weights,
              {{DNNL_ARG_SRC, src},
               {DNNL_ARG_DIFF_DST, L.dz_mem},
               {DNNL_ARG_DIFF_WEIGHTS,
                Wrap(L.weights_md, engine_, grads_[2 * l].data())},
               {DNNL_ARG_DIFF_BIAS,
                Wrap(L.bias_md, engine_, grads_[2 * l + 1].data())}},
              "inner_product_backward_weights", name));
      if (l == 0) break;
      Plan::Layer& prev = p.layers[l - 1];
      TETHER_RETURN_IF_ERROR(
          Run(L.bwd_data,
              {{DNNL_ARG_DIFF_DST, L.dz_mem},
               {DNNL_ARG_WEIGHTS,
                Wrap(L.weights_md, engine_, weights_[2 * l].data())},
               {DNNL_ARG_DIFF_SRC, prev.da_mem}},
              "inner_product_backward_data", name));
      TETHER_RETURN_IF_ERROR(Run(prev.relu_bwd,
                                 {{DNNL_ARG_SRC, prev.z_mem},
                                  {DNNL_ARG_DIFF_DST, prev.da_mem},
                                  {DNNL_ARG_DIFF_SRC, prev.dz_mem}},
                                 "eltwise_backward (relu)",
                                 layers_[l - 1].name));
    }
    return Status::Ok();
  }

  // Constant after construction.
  const std::vector<LayerDef> layers_;
  const int features_;
  const int classes_;
  const int max_batch_;
  const int threads_;
  dnnl::engine engine_;
  dnnl::stream stream_;

  std::map<int, std::unique_ptr<Plan>> plans_;  // by batch size
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

Result<std::unique_ptr<DenseModel>> Finish(std::unique_ptr<FcModel> model) {
  Status s = model->Prepare();
  if (!s.ok()) return s;
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

Result<std::unique_ptr<DenseModel>> MakeSoftmaxRegression(int features,
                                                          int classes,
                                                          int max_batch,
                                                          int threads) {
  TETHER_RETURN_IF_ERROR(CheckCommon(features, classes, max_batch));
  auto model = std::make_unique<FcModel>(
      std::vector<LayerDef>{{"softmax", features, classes, false}}, max_batch,
      threads);
  model->InitParams({Init{InitKind::kZeros, 0.0f}}, 1);
  return Finish(std::move(model));
}

Result<std::unique_ptr<DenseModel>> MakeMlp(int features,
                                            const std::vector<int>& hidden,
                                            int classes, int max_batch,
                                            int threads) {
  TETHER_RETURN_IF_ERROR(CheckCommon(features, classes, max_batch));
  std::vector<LayerDef> layers;
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
  auto model = std::make_unique<FcModel>(std::move(layers), max_batch, threads);
  model->InitParams(inits, 1);
  return Finish(std::move(model));
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
