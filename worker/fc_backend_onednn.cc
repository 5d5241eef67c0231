// The oneDNN (CPU) backend of worker/fc_backend.h: inner-product, ReLU and
// log-softmax primitives, planned once per batch size.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>
#include <utility>

#include "oneapi/dnnl/dnnl.hpp"
#include "worker/fc_backend.h"

namespace tether {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Args = std::unordered_map<int, memory>;

constexpr memory::data_type kF32 = memory::data_type::f32;
// Plans kept besides the one for max_batch; a training loop sees at most
// two batch sizes (full and the last partial), evaluation one more.
constexpr size_t kMaxExtraPlans = 4;

// The primitives and activation buffers for one batch size. Parameters and
// inputs are bound per call.
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

class OneDnnBackend final : public FcBackend {
 public:
  OneDnnBackend(std::vector<FcLayer> layers, int max_batch, int threads)
      : layers_(std::move(layers)),
        classes_(layers_.back().out),
        features_(layers_.front().in),
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

  Status Prepare() { return GetPlan(max_batch_).status(); }

  std::string Describe() const override { return "cpu"; }

  Result<float> Step(const std::vector<std::vector<float>>& weights,
                     const float* x, const int32_t* y, int batch,
                     std::vector<std::vector<float>>& grads) override {
    return StepWithHooks(weights, x, y, batch, grads, StepHooks{});
  }

  Result<float> StepWithHooks(const std::vector<std::vector<float>>& weights,
                              const float* x, const int32_t* y, int batch,
                              std::vector<std::vector<float>>& grads,
                              const StepHooks& hooks) override {
    if (threads_ > 0) omp_set_num_threads(threads_);
    TETHER_ASSIGN_OR_RETURN(Plan * plan, GetPlan(batch));
    Plan& p = *plan;
    TETHER_RETURN_IF_ERROR(Forward(p, weights, x, hooks.weights_needed));
    TETHER_RETURN_IF_ERROR(Wait());

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
    const float mean = float(loss / batch);
    if (hooks.loss_known) TETHER_RETURN_IF_ERROR(hooks.loss_known(mean));
    TETHER_RETURN_IF_ERROR(Backward(p, weights, x, grads, hooks.grads_ready));
    TETHER_RETURN_IF_ERROR(Wait());
    return mean;
  }

  Result<EvalResult> Evaluate(const std::vector<std::vector<float>>& weights,
                              const float* x, const int32_t* y,
                              size_t rows) override {
    if (threads_ > 0) omp_set_num_threads(threads_);
    EvalResult result;
    for (size_t start = 0; start < rows; start += size_t(max_batch_)) {
      const int n = int(std::min(rows - start, size_t(max_batch_)));
      TETHER_ASSIGN_OR_RETURN(Plan * plan, GetPlan(n));
      Plan& p = *plan;
      TETHER_RETURN_IF_ERROR(
          Forward(p, weights, x + start * features_, nullptr));
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
        const FcLayer& d = layers_[l];
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

  // `weights_needed` (may be empty) is called before each layer.
  Status Forward(Plan& p, const std::vector<std::vector<float>>& weights,
                 const float* x,
                 const std::function<Status(size_t)>& weights_needed) {
    memory src = Wrap(p.layers.front().src_md, engine_, x);
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (weights_needed) TETHER_RETURN_IF_ERROR(weights_needed(l));
      Plan::Layer& L = p.layers[l];
      const std::string& name = layers_[l].name;
      TETHER_RETURN_IF_ERROR(Run(
          L.fwd,
          {{DNNL_ARG_SRC, src},
           {DNNL_ARG_WEIGHTS,
            Wrap(L.weights_md, engine_, weights[2 * l].data())},
           {DNNL_ARG_BIAS, Wrap(L.bias_md, engine_, weights[2 * l + 1].data())},
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
  // `grads_ready` (may be empty) is called once a layer's are computed.
  Status Backward(Plan& p, const std::vector<std::vector<float>>& weights,
                  const float* x, std::vector<std::vector<float>>& grads,
                  const std::function<void(size_t)>& grads_ready) {
    for (size_t l = layers_.size(); l-- > 0;) {
      Plan::Layer& L = p.layers[l];
      const std::string& name = layers_[l].name;
      memory src = l == 0 ? Wrap(L.src_md, engine_, x) : p.layers[l - 1].a_mem;
      TETHER_RETURN_IF_ERROR(
          Run(L.bwd_weights,
              {{DNNL_ARG_SRC, src},
               {DNNL_ARG_DIFF_DST, L.dz_mem},
               {DNNL_ARG_DIFF_WEIGHTS,
                Wrap(L.weights_md, engine_, grads[2 * l].data())},
               {DNNL_ARG_DIFF_BIAS,
                Wrap(L.bias_md, engine_, grads[2 * l + 1].data())}},
              "inner_product_backward_weights", name));
      if (grads_ready) {
        TETHER_RETURN_IF_ERROR(Wait());
        grads_ready(l);
      }
      if (l == 0) break;
      Plan::Layer& prev = p.layers[l - 1];
      TETHER_RETURN_IF_ERROR(
          Run(L.bwd_data,
              {{DNNL_ARG_DIFF_DST, L.dz_mem},
               {DNNL_ARG_WEIGHTS,
                Wrap(L.weights_md, engine_, weights[2 * l].data())},
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
  const std::vector<FcLayer> layers_;
  const int classes_;
  const int features_;
  const int max_batch_;
  const int threads_;
  dnnl::engine engine_;
  dnnl::stream stream_;

  std::map<int, std::unique_ptr<Plan>> plans_;  // by batch size
};

}  // namespace

Result<std::unique_ptr<FcBackend>> MakeOneDnnBackend(
    std::vector<FcLayer> layers, int max_batch, int threads) {
  TETHER_RETURN_IF_ERROR(CheckFcLayers(layers, max_batch));
  auto backend =
      std::make_unique<OneDnnBackend>(std::move(layers), max_batch, threads);
  TETHER_RETURN_IF_ERROR(backend->Prepare());
  return std::unique_ptr<FcBackend>(std::move(backend));
}

}  // namespace tether
