// The compute backend interface (worker/fc_backend.h): devices parse or are
// refused naming the flag, the CPU backend computes what the model returns,
// and the CUDA backend either matches the CPU backend within float
// tolerance (on a machine with a GPU) or says why it cannot run.
#include "worker/fc_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "worker/model.h"

namespace tether {
namespace {

TEST(Device, ParsesCpuCudaAndCudaN) {
  auto cpu = ParseDevice("cpu", "--device");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->kind, Device::Kind::kCpu);
  EXPECT_EQ(cpu->ToString(), "cpu");
  auto cuda = ParseDevice("cuda", "--device");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->ToString(), "cuda:0");
  auto third = ParseDevice("cuda:2", "--device");
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->kind, Device::Kind::kCuda);
  EXPECT_EQ(third->index, 2);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", ""}) {
    auto parsed = ParseDevice(bad, "--device");
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("--device"), std::string::npos);
  }
}

// The layers, weights and a batch of the MLP 12 -> 9 -> 7 -> 4, or of
// softmax regression 12 -> 4.
struct Case {
  std::vector<FcLayer> layers;
  std::vector<std::vector<float>> weights, grads;
  std::vector<float> x;
  std::vector<int32_t> y;

  explicit Case(int batch, bool mlp = true) {
    layers = mlp ? std::vector<FcLayer>{{"fc1", 12, 9, true},
                                        {"fc2", 9, 7, true},
                                        {"fc3", 7, 4, false}}
                 : std::vector<FcLayer>{{"softmax", 12, 4, false}};
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (const FcLayer& l : layers) {
      for (size_t n : {size_t(l.out) * l.in, size_t(l.out)}) {
        std::vector<float> w(n);
        for (float& v : w) v = u(rng);
        weights.push_back(std::move(w));
        grads.emplace_back(n, 0.0f);
      }
    }
    x.resize(size_t(batch) * 12);
    for (float& v : x) v = u(rng) * 2;
    for (int r = 0; r < batch; ++r) y.push_back(r % 4);
  }
};

TEST(OneDnnBackend, ComputesWhatTheModelReturns) {
  Case c(5);
  auto backend = MakeOneDnnBackend(c.layers, 8, 1);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EXPECT_EQ((*backend)->Describe(), "cpu");
  auto loss = (*backend)->Step(c.weights, c.x.data(), c.y.data(), 5, c.grads);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();

  auto model = MakeMlp(12, {9, 7}, 4, 8, 1);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model)->device(), "cpu");
  (*model)->weights() = c.weights;
  auto model_loss = (*model)->Step(c.x.data(), c.y.data(), 5);
  ASSERT_TRUE(model_loss.ok());
  EXPECT_FLOAT_EQ(*model_loss, *loss);
  ASSERT_EQ((*model)->grads().size(), c.grads.size());
  for (size_t t = 0; t < c.grads.size(); ++t) {
    EXPECT_EQ((*model)->grads()[t], c.grads[t]) << "parameter " << t;
  }
  // Evaluation over more rows than max_batch, in pieces.
  Case many(20);
  auto eval =
      (*backend)->Evaluate(many.weights, many.x.data(), many.y.data(), 20);
  ASSERT_TRUE(eval.ok());
  EXPECT_EQ(eval->rows, 20);
  EXPECT_GT(eval->loss_sum, 0);
}

// The hooks a training loop overlaps the wire with: forward asks for each
// layer's weights in order, the loss comes before any gradient, and each
// layer's gradients are announced last layer first, already final (the
// same bits as a plain Step) while backward goes on below them. An error
// from a hook ends the step with it, before any gradient is announced.
TEST(OneDnnBackend, HooksComeLayerByLayerWithFinalGradients) {
  Case c(5);
  auto backend = MakeOneDnnBackend(c.layers, 8, 1);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  std::vector<std::vector<float>> plain = c.grads;
  auto plain_loss =
      (*backend)->Step(c.weights, c.x.data(), c.y.data(), 5, plain);
  ASSERT_TRUE(plain_loss.ok());

  std::vector<std::string> events;
  std::vector<std::vector<float>> announced(c.grads.size());
  StepHooks hooks;
  hooks.weights_needed = [&](size_t l) {
    events.push_back("w" + std::to_string(l));
    return Status::Ok();
  };
  hooks.loss_known = [&](float loss) {
    events.push_back("loss");
    EXPECT_FLOAT_EQ(loss, *plain_loss);
    return Status::Ok();
  };
  hooks.grads_ready = [&](size_t l) {
    events.push_back("g" + std::to_string(l));
    announced[2 * l] = c.grads[2 * l];
    announced[2 * l + 1] = c.grads[2 * l + 1];
  };
  auto loss = (*backend)->StepWithHooks(c.weights, c.x.data(), c.y.data(), 5,
                                        c.grads, hooks);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_EQ(*loss, *plain_loss);
  EXPECT_EQ(events, (std::vector<std::string>{"w0", "w1", "w2", "loss", "g2",
                                              "g1", "g0"}));
  for (size_t t = 0; t < c.grads.size(); ++t) {
    EXPECT_EQ(announced[t], plain[t]) << "parameter " << t;
    EXPECT_EQ(c.grads[t], plain[t]) << "parameter " << t;
  }

  // Weights that never came end the step in forward.
  events.clear();
  hooks.weights_needed = [&](size_t l) {
    events.push_back("w" + std::to_string(l));
    return l == 1 ? Unavailable("lost shard 1") : Status::Ok();
  };
  loss = (*backend)->StepWithHooks(c.weights, c.x.data(), c.y.data(), 5,
                                   c.grads, hooks);
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().message(), "lost shard 1");
  EXPECT_EQ(events, (std::vector<std::string>{"w0", "w1"}));

  // A refused loss (a diverged model) sends no gradient.
  events.clear();
  hooks.weights_needed = nullptr;
  hooks.loss_known = [&](float) {
    events.push_back("loss");
    return Status(Code::kNonFinite, "the training loss is NaN");
  };
  loss = (*backend)->StepWithHooks(c.weights, c.x.data(), c.y.data(), 5,
                                   c.grads, hooks);
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), Code::kNonFinite);
  EXPECT_EQ(events, std::vector<std::string>{"loss"});
}

// A backend that computes everything at once (the CUDA one) gets the same
// contract from FcBackend's default: every layer's weights asked for first,
// then the loss, then every layer's gradients, last layer first.
TEST(FcBackend, DefaultHooksComeAroundTheWholeStep) {
  class Whole final : public FcBackend {
   public:
    std::string Describe() const override { return "whole"; }
    Result<float> Step(const std::vector<std::vector<float>>&, const float*,
                       const int32_t*, int,
                       std::vector<std::vector<float>>& grads) override {
      for (auto& g : grads) std::fill(g.begin(), g.end(), 1.0f);
      return 0.5f;
    }
    Result<EvalResult> Evaluate(const std::vector<std::vector<float>>&,
                                const float*, const int32_t*, size_t) override {
      return EvalResult{};
    }
  } whole;
  Case c(2);
  std::vector<std::string> events;
  StepHooks hooks;
  hooks.weights_needed = [&](size_t l) {
    events.push_back("w" + std::to_string(l));
    return Status::Ok();
  };
  hooks.loss_known = [&](float loss) {
    events.push_back("loss " + std::to_string(loss));
    return Status::Ok();
  };
  hooks.grads_ready = [&](size_t l) {
    EXPECT_EQ(c.grads[2 * l][0], 1.0f);
    events.push_back("g" + std::to_string(l));
  };
  auto loss =
      whole.StepWithHooks(c.weights, c.x.data(), c.y.data(), 2, c.grads, hooks);
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(events, (std::vector<std::string>{"w0", "w1", "w2", "loss 0.500000",
                                              "g2", "g1", "g0"}));
}

// The largest |a - b| over every element of two sets of buffers, and the
// largest |a| (the scale the difference is judged against).
struct Difference {
  double worst = 0;
  double scale = 0;
};
Difference Compare(const std::vector<std::vector<float>>& a,
                   const std::vector<std::vector<float>>& b) {
  Difference d;
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].size(); ++i) {
      d.worst = std::max(d.worst, double(std::abs(a[t][i] - b[t][i])));
      d.scale = std::max(d.scale, double(std::abs(a[t][i])));
    }
  }
  return d;
}

// One training step of both backends on the same weights and batch: the
// losses and every gradient agree to float accuracy (cuBLAS and oneDNN sum
// in different orders).
void ExpectSameStep(FcBackend& cpu, FcBackend& gpu, Case& c, int batch,
                    const std::string& what) {
  std::vector<std::vector<float>> gpu_grads = c.grads;
  auto a = cpu.Step(c.weights, c.x.data(), c.y.data(), batch, c.grads);
  auto b = gpu.Step(c.weights, c.x.data(), c.y.data(), batch, gpu_grads);
  ASSERT_TRUE(a.ok()) << what << ": " << a.status().ToString();
  ASSERT_TRUE(b.ok()) << what << ": " << b.status().ToString();
  EXPECT_NEAR(*a, *b, 1e-4f * std::max(1.0f, std::abs(*a))) << what;
  const Difference d = Compare(c.grads, gpu_grads);
  EXPECT_LE(d.worst, 1e-4 * std::max(1e-2, d.scale)) << what;
  std::cout << what << ": loss cpu " << *a << " cuda " << *b
            << ", largest gradient difference " << d.worst << " (largest "
            << "gradient " << d.scale << ")\n";
}

void ExpectSameEvaluation(FcBackend& cpu, FcBackend& gpu, Case& c, size_t rows,
                          const std::string& what) {
  auto ea = cpu.Evaluate(c.weights, c.x.data(), c.y.data(), rows);
  auto eb = gpu.Evaluate(c.weights, c.x.data(), c.y.data(), rows);
  ASSERT_TRUE(ea.ok() && eb.ok()) << what << ": " << eb.status().ToString();
  EXPECT_EQ(ea->rows, int64_t(rows)) << what;
  EXPECT_EQ(eb->rows, int64_t(rows)) << what;
  EXPECT_EQ(ea->correct, eb->correct) << what;
  EXPECT_NEAR(ea->loss_sum, eb->loss_sum, 1e-4 * std::max(1.0, ea->loss_sum))
      << what;
  std::cout << what << ": correct cpu " << ea->correct << " cuda "
            << eb->correct << " of " << rows << ", loss sum cpu "
            << ea->loss_sum << " cuda " << eb->loss_sum << "\n";
}

// On a machine with a GPU (tools/gpu-check runs this there): the CUDA
// backend's loss, gradients and evaluation match the CPU's, for a full
// batch (= max_batch), a partial one and batch 1, with weights changed in
// place and replaced between steps, and evaluation in several pieces with
// a partial last one. Elsewhere: kUnavailable saying why, which is what
// `--device cuda` prints. Returns false when no GPU ran it.
bool ExpectCudaMatchesCpu(bool mlp, int index = 0) {
  const int max_batch = 8;
  Case c(3 * max_batch + 5, mlp);
  auto cuda = MakeCudaBackend(c.layers, max_batch, index);
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), Code::kUnavailable);
    const std::string& why = cuda.status().message();
    EXPECT_NE(why.find("--device cuda:" + std::to_string(index)),
              std::string::npos)
        << why;
    std::cout << "CUDA backend unavailable here: " << why << "\n";
    auto model = MakeSoftmaxRegression(12, 4, max_batch, 1,
                                       Device{Device::Kind::kCuda, index});
    EXPECT_FALSE(model.ok());
    if (!model.ok()) {
      EXPECT_EQ(model.status().message(), why);
    }
    return false;
  }
  std::cout << "CUDA backend: " << (*cuda)->Describe() << "\n";
  auto onednn = MakeOneDnnBackend(c.layers, max_batch, 1);
  EXPECT_TRUE(onednn.ok());
  if (!onednn.ok()) return true;
  FcBackend& cpu = **onednn;
  FcBackend& gpu = **cuda;
  for (int batch : {max_batch, 3, 1}) {
    ExpectSameStep(cpu, gpu, c, batch, "batch " + std::to_string(batch));
  }
  // Weights changed in place, then replaced by new vectors of the same
  // size (the host buffers a backend saw before are gone).
  for (std::vector<float>& w : c.weights) {
    for (float& v : w) v *= -0.75f;
  }
  ExpectSameStep(cpu, gpu, c, max_batch, "weights changed in place");
  for (std::vector<float>& w : c.weights) {
    std::vector<float> fresh(w.size());
    for (size_t i = 0; i < w.size(); ++i) fresh[i] = w[i] * 1.5f + 0.01f;
    w = std::move(fresh);
  }
  ExpectSameStep(cpu, gpu, c, 5, "weights replaced");
  ExpectSameEvaluation(cpu, gpu, c, c.y.size(),
                       "evaluation of " + std::to_string(c.y.size()) +
                           " rows in pieces of " + std::to_string(max_batch));
  ExpectSameEvaluation(cpu, gpu, c, 1, "evaluation of 1 row");

  // Refused without touching the device's state: the next step still works.
  auto too_big =
      gpu.Step(c.weights, c.x.data(), c.y.data(), max_batch + 1, c.grads);
  EXPECT_EQ(too_big.status().code(), Code::kInvalidArgument);
  auto zero = gpu.Step(c.weights, c.x.data(), c.y.data(), 0, c.grads);
  EXPECT_EQ(zero.status().code(), Code::kInvalidArgument);
  std::vector<std::vector<float>> short_weights = c.weights;
  short_weights.front().pop_back();
  auto wrong = gpu.Step(short_weights, c.x.data(), c.y.data(), 2, c.grads);
  EXPECT_EQ(wrong.status().code(), Code::kInvalidArgument);
  std::vector<int32_t> bad_labels = c.y;
  bad_labels[1] = 99;
  auto bad = gpu.Step(c.weights, c.x.data(), bad_labels.data(), 4, c.grads);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  ExpectSameStep(cpu, gpu, c, 4, "after refused calls");
  return true;
}

TEST(CudaBackend, MatchesTheCpuBackendOrSaysWhyItCannotRun) {
  {
    SCOPED_TRACE("mlp");
    ExpectCudaMatchesCpu(true);
  }
  {
    SCOPED_TRACE("softmax");
    ExpectCudaMatchesCpu(false);
  }
}

// The real MLP of tether-worker --model mlp (784-256-128-10, batch 64):
// sums over 784 and 256 terms, where summation order shows if anywhere.
TEST(CudaBackend, MatchesTheCpuOnTheRealMlpSizes) {
  const std::vector<FcLayer> layers = {{"fc1", 784, 256, true},
                                       {"fc2", 256, 128, true},
                                       {"fc3", 128, 10, false}};
  auto cuda = MakeCudaBackend(layers, 64, 0);
  if (!cuda.ok()) {
    std::cout << "CUDA backend unavailable here: " << cuda.status().message()
              << "\n";
    EXPECT_EQ(cuda.status().code(), Code::kUnavailable);
    return;
  }
  auto onednn = MakeOneDnnBackend(layers, 64, 1);
  ASSERT_TRUE(onednn.ok());
  Case c(1, true);  // replaced below
  c.layers = layers;
  c.weights.clear();
  c.grads.clear();
  std::mt19937 rng(5);
  for (const FcLayer& l : layers) {
    const float scale = std::sqrt(6.0f / float(l.in + l.out));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (size_t n : {size_t(l.out) * l.in, size_t(l.out)}) {
      std::vector<float> w(n);
      for (float& v : w) v = u(rng);
      c.weights.push_back(std::move(w));
      c.grads.emplace_back(n, 0.0f);
    }
  }
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  c.x.resize(64 * 784);
  for (float& v : c.x) v = pixel(rng);
  c.y.clear();
  for (int r = 0; r < 64; ++r) c.y.push_back(r % 10);
  ExpectSameStep(**onednn, **cuda, c, 64, "784-256-128-10, batch 64");
  ExpectSameEvaluation(**onednn, **cuda, c, 64, "784-256-128-10 evaluation");
}

// Where the machine has several GPUs: device 1 computes what the CPU does;
// with one, asking for device 1 names how many there are.
TEST(CudaBackend, ADeviceAboveZeroWorksOrIsNamedMissing) {
  Case c(4);
  auto first = MakeCudaBackend(c.layers, 8, 0);
  if (!first.ok()) {
    std::cout << "CUDA backend unavailable here: " << first.status().message()
              << "\n";
    return;  // no GPU: MatchesTheCpuBackendOrSaysWhyItCannotRun covers this
  }
  auto second = MakeCudaBackend(c.layers, 8, 1);
  if (!second.ok()) {
    EXPECT_EQ(second.status().code(), Code::kUnavailable);
    EXPECT_NE(second.status().message().find("no such device (1 CUDA device)"),
              std::string::npos)
        << second.status().message();
    std::cout << "one GPU: " << second.status().message() << "\n";
    return;
  }
  SCOPED_TRACE("device 1");
  EXPECT_TRUE(ExpectCudaMatchesCpu(true, 1));
}

// What needs no GPU is refused before CUDA is loaded, the same on every
// machine: bad layer stacks, a negative index, and a last layer with ReLU
// (the CUDA backend takes the loss on the last layer's pre-activations).
TEST(CudaBackend, RefusesBadLayersAndALastReluNamingThem) {
  auto refused = [](std::vector<FcLayer> layers, int max_batch, int index,
                    const std::string& says) {
    auto b = MakeCudaBackend(std::move(layers), max_batch, index);
    ASSERT_FALSE(b.ok()) << says;
    EXPECT_EQ(b.status().code(), Code::kInvalidArgument)
        << b.status().message();
    EXPECT_NE(b.status().message().find(says), std::string::npos)
        << b.status().message();
  };
  refused({{"fc1", 4, 3, true}, {"fc2", 3, 2, true}}, 8, 0,
          "the last layer (fc2) has ReLU");
  refused({{"fc1", 4, 3, true}, {"fc2", 5, 2, false}}, 8, 0,
          "layer fc2 takes 5 inputs but layer fc1 gives 3");
  refused({}, 8, 0, "no layers");
  refused({{"fc1", 4, 0, false}}, 8, 0, "layer fc1 is [0, 4]");
  refused({{"fc1", 4, 3, false}}, 0, 0, "max_batch must be >= 1");
  refused({{"fc1", 4, 3, false}}, 8, -1, "negative device index");
  // The CPU backend refuses the same stacks the same way.
  auto cpu =
      MakeOneDnnBackend({{"fc1", 4, 3, true}, {"fc2", 5, 2, false}}, 8, 1);
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find("takes 5 inputs"), std::string::npos);
}

}  // namespace
}  // namespace tether
