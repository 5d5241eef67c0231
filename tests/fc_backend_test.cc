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

// On a machine with a GPU (tools/gpu-check runs this there): the CUDA
// backend's loss, gradients and evaluation match the CPU's. Elsewhere:
// kUnavailable saying why, which is what `--device cuda` prints.
void ExpectCudaMatchesCpu(bool mlp) {
  Case cpu(6, mlp), gpu(6, mlp);
  auto cuda = MakeCudaBackend(gpu.layers, 8, 0);
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), Code::kUnavailable);
    const std::string& why = cuda.status().message();
    EXPECT_NE(why.find("--device cuda:0"), std::string::npos) << why;
    std::cout << "CUDA backend unavailable here: " << why << "\n";
    auto model =
        MakeSoftmaxRegression(12, 4, 8, 1, Device{Device::Kind::kCuda, 0});
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().message(), why);
    return;
  }
  std::cout << "CUDA backend: " << (*cuda)->Describe() << "\n";
  auto onednn = MakeOneDnnBackend(cpu.layers, 8, 1);
  ASSERT_TRUE(onednn.ok());
  for (int batch : {6, 3}) {  // full and partial batches
    auto a = (*onednn)->Step(cpu.weights, cpu.x.data(), cpu.y.data(), batch,
                             cpu.grads);
    auto b = (*cuda)->Step(gpu.weights, gpu.x.data(), gpu.y.data(), batch,
                           gpu.grads);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
    EXPECT_NEAR(*a, *b, 1e-4f * std::max(1.0f, std::abs(*a)));
    double worst = 0;
    for (size_t t = 0; t < cpu.grads.size(); ++t) {
      for (size_t i = 0; i < cpu.grads[t].size(); ++i) {
        worst = std::max(worst,
                         double(std::abs(cpu.grads[t][i] - gpu.grads[t][i])));
      }
    }
    EXPECT_LT(worst, 1e-5) << "batch " << batch;
    std::cout << "batch " << batch << ": loss cpu " << *a << " cuda " << *b
              << ", largest gradient difference " << worst << "\n";
  }
  auto ea = (*onednn)->Evaluate(cpu.weights, cpu.x.data(), cpu.y.data(), 6);
  auto eb = (*cuda)->Evaluate(gpu.weights, gpu.x.data(), gpu.y.data(), 6);
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(ea->correct, eb->correct);
  EXPECT_EQ(ea->rows, eb->rows);
  EXPECT_NEAR(ea->loss_sum, eb->loss_sum, 1e-3);
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

}  // namespace
}  // namespace tether
