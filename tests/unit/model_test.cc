#include "worker/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace tether {
namespace {

// Relative error that tolerates the float rounding of tiny gradients.
double RelError(double analytic, double numeric) {
  return std::abs(analytic - numeric) /
         std::max(1e-2, std::abs(analytic) + std::abs(numeric));
}

void FillUniform(std::vector<float>* v, float scale, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  for (float& f : *v) f = u(*rng);
}

// Checks every parameter of every tensor against central differences of
// the loss Step() returns.
void ExpectGradientsMatch(DenseModel* model, const std::vector<float>& x,
                          const std::vector<int32_t>& y) {
  const int batch = int(y.size());
  Result<float> loss = model->Step(x.data(), y.data(), batch);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  const std::vector<std::vector<float>> analytic = model->grads();
  constexpr float kEps = 1e-3f;
  for (size_t t = 0; t < model->specs().size(); ++t) {
    std::vector<float>& w = model->weights()[t];
    ASSERT_EQ(analytic[t].size(), model->specs()[t].size());
    for (size_t i = 0; i < w.size(); ++i) {
      const float saved = w[i];
      w[i] = saved + kEps;
      Result<float> up = model->Step(x.data(), y.data(), batch);
      w[i] = saved - kEps;
      Result<float> down = model->Step(x.data(), y.data(), batch);
      w[i] = saved;
      ASSERT_TRUE(up.ok() && down.ok());
      const double numeric = (double(*up) - double(*down)) / (2.0 * kEps);
      EXPECT_LT(RelError(analytic[t][i], numeric), 2e-2)
          << model->specs()[t].name << "[" << i << "]: analytic "
          << analytic[t][i] << " numeric " << numeric;
    }
  }
}

TEST(Gradients, SoftmaxRegressionMatchesFiniteDifferences) {
  auto model = MakeSoftmaxRegression(6, 4, 8, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::mt19937 rng(7);
  for (auto& w : (*model)->weights()) FillUniform(&w, 0.5f, &rng);
  std::vector<float> x(5 * 6);
  FillUniform(&x, 1.0f, &rng);
  // A batch smaller than max_batch exercises the second set of primitives.
  ExpectGradientsMatch(model->get(), x, {0, 3, 1, 3, 2});
}

TEST(Gradients, MlpMatchesFiniteDifferences) {
  auto model = MakeMlp(12, {7, 5}, 3, 4, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<ParamSpec>& specs = (*model)->specs();
  ASSERT_EQ(specs.size(), 6u);
  EXPECT_EQ(specs[0].name, "fc1.weight");
  EXPECT_EQ(specs[0].shape, (std::vector<uint64_t>{7, 12}));
  EXPECT_EQ(specs[5].name, "fc3.bias");
  EXPECT_EQ(specs[5].shape, (std::vector<uint64_t>{3}));
  std::mt19937 rng(11);
  // Random biases too, so their gradients are checked away from zero.
  for (auto& w : (*model)->weights()) FillUniform(&w, 0.6f, &rng);
  std::vector<float> x(4 * 12);
  FillUniform(&x, 1.0f, &rng);
  ExpectGradientsMatch(model->get(), x, {2, 0, 1, 2});
}

TEST(Gradients, SparseLrMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<SparseExample> batch;
  for (int i = 0; i < 6; ++i) {
    SparseExample ex;
    ex.label = float(i % 2);
    for (uint64_t k : {uint64_t(i % 3), uint64_t(10 + i % 4), uint64_t(99)}) {
      ex.keys.push_back(k);
      ex.values.push_back(u(rng));
    }
    batch.push_back(ex);
  }
  const std::vector<uint64_t> keys =
      SparseLogisticRegression::UniqueKeys(batch);
  std::vector<float> w(keys.size());
  for (float& v : w) v = u(rng);
  float bias = 0.3f;
  std::vector<float> grad(keys.size());
  float grad_bias = 0;
  SparseLogisticRegression::Step(batch, keys, w, bias, grad, &grad_bias);

  constexpr float kEps = 1e-3f;
  std::vector<float> scratch(keys.size());
  float scratch_bias;
  auto loss = [&] {
    return double(SparseLogisticRegression::Step(batch, keys, w, bias, scratch,
                                                 &scratch_bias));
  };
  for (size_t i = 0; i < w.size(); ++i) {
    const float saved = w[i];
    w[i] = saved + kEps;
    const double up = loss();
    w[i] = saved - kEps;
    const double down = loss();
    w[i] = saved;
    const double numeric = (up - down) / (2 * kEps);
    EXPECT_LT(RelError(grad[i], numeric), 2e-2) << "key " << keys[i];
  }
  bias += kEps;
  const double up = loss();
  bias -= 2 * kEps;
  const double down = loss();
  EXPECT_LT(RelError(grad_bias, (up - down) / (2 * kEps)), 2e-2);
}

// Three Gaussian blobs far apart in 8 dimensions.
void MakeBlobs(int rows, std::vector<float>* x, std::vector<int32_t>* y) {
  constexpr int kFeatures = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  x->assign(size_t(rows) * kFeatures, 0.0f);
  y->assign(rows, 0);
  for (int r = 0; r < rows; ++r) {
    const int label = r % 3;
    (*y)[r] = label;
    for (int f = 0; f < kFeatures; ++f) {
      const float center = (f % 3 == label) ? 1.5f : -0.5f;
      (*x)[size_t(r) * kFeatures + f] = center + noise(rng);
    }
  }
}

double TrainAndScore(DenseModel* model, const std::vector<float>& x,
                     const std::vector<int32_t>& y, int batch, int steps,
                     float lr, float* first_loss, float* last_loss) {
  const int rows = int(y.size());
  const int features = int(x.size() / y.size());
  for (int s = 0; s < steps; ++s) {
    const int start = (s * batch) % rows;
    const int n = std::min(batch, rows - start);
    Result<float> loss =
        model->Step(&x[size_t(start) * features], &y[start], n);
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    if (!loss.ok()) return 0;
    if (s == 0) *first_loss = *loss;
    *last_loss = *loss;
    for (size_t t = 0; t < model->weights().size(); ++t) {
      std::vector<float>& w = model->weights()[t];
      const std::vector<float>& g = model->grads()[t];
      for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
    }
  }
  Result<EvalResult> eval = model->Evaluate(x.data(), y.data(), y.size());
  EXPECT_TRUE(eval.ok()) << eval.status().ToString();
  if (!eval.ok()) return 0;
  EXPECT_EQ(eval->rows, rows);
  return double(eval->correct) / double(eval->rows);
}

TEST(Model, LossDecreasesWithSgdOnSeparableData) {
  std::vector<float> x;
  std::vector<int32_t> y;
  MakeBlobs(300, &x, &y);
  float first = 0, last = 0;

  auto softmax = MakeSoftmaxRegression(8, 3, 32, 1);
  ASSERT_TRUE(softmax.ok()) << softmax.status().ToString();
  // 300 rows in batches of 32 end on a partial batch of 12.
  EXPECT_GT(TrainAndScore(softmax->get(), x, y, 32, 300, 0.2f, &first, &last),
            0.95);
  EXPECT_LT(last, first);

  auto mlp = MakeMlp(8, {16, 8}, 3, 32, 1);
  ASSERT_TRUE(mlp.ok()) << mlp.status().ToString();
  EXPECT_GT(TrainAndScore(mlp->get(), x, y, 32, 300, 0.2f, &first, &last),
            0.95);
  EXPECT_LT(last, first);
}

TEST(Model, EvaluateCountsCorrect) {
  // Identity weights: the logits are the inputs themselves.
  auto model = MakeSoftmaxRegression(3, 3, 4, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<float>& w = (*model)->weights()[0];
  for (int i = 0; i < 3; ++i) w[i * 3 + i] = 1.0f;
  // Ten rows (pieces of 4, 4, 2): row r has its peak at r % 3; rows whose
  // index is a multiple of 4 carry a wrong label.
  std::vector<float> x(10 * 3, 0.0f);
  std::vector<int32_t> y(10);
  double expected_loss = 0;
  const double log_norm = std::log(std::exp(2.0) + 2.0);
  for (int r = 0; r < 10; ++r) {
    x[r * 3 + r % 3] = 2.0f;
    y[r] = (r % 4 == 0) ? (r + 1) % 3 : r % 3;
    expected_loss += log_norm - (y[r] == r % 3 ? 2.0 : 0.0);
  }
  Result<EvalResult> eval = (*model)->Evaluate(x.data(), y.data(), 10);
  ASSERT_TRUE(eval.ok()) << eval.status().ToString();
  EXPECT_EQ(eval->rows, 10);
  EXPECT_EQ(eval->correct, 7);  // rows 0, 4 and 8 are wrong
  EXPECT_NEAR(eval->loss_sum, expected_loss, 1e-4);

  Result<EvalResult> none = (*model)->Evaluate(x.data(), y.data(), 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->rows, 0);
}

TEST(Model, RejectsBadLabelsAndBatch) {
  auto model = MakeMlp(4, {3}, 2, 2, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  DenseModel& m = **model;
  const std::vector<float> x(3 * 4, 0.5f);
  const std::vector<int32_t> good = {0, 1, 1};

  EXPECT_EQ(m.Step(x.data(), good.data(), 0).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(m.Step(x.data(), good.data(), 3).status().code(),
            Code::kInvalidArgument);
  const std::vector<int32_t> too_big = {0, 2};
  EXPECT_EQ(m.Step(x.data(), too_big.data(), 2).status().code(),
            Code::kInvalidArgument);
  const std::vector<int32_t> negative = {-1, 0};
  EXPECT_EQ(m.Step(x.data(), negative.data(), 2).status().code(),
            Code::kInvalidArgument);
  const std::vector<int32_t> late_bad = {0, 1, 5};
  EXPECT_EQ(m.Evaluate(x.data(), late_bad.data(), 3).status().code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(m.Step(x.data(), good.data(), 2).ok());

  m.weights()[0].resize(1);
  EXPECT_EQ(m.Step(x.data(), good.data(), 2).status().code(),
            Code::kInvalidArgument);

  EXPECT_EQ(MakeMlp(4, {0}, 2, 2, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MakeSoftmaxRegression(4, 2, 0, 1).status().code(),
            Code::kInvalidArgument);
}

TEST(SparseLr, UniqueKeysSortedDistinct) {
  std::vector<SparseExample> batch(3);
  batch[0].keys = {42, 7, 7};
  batch[1].keys = {};
  batch[2].keys = {1000000000000ull, 7, 3};
  EXPECT_EQ(SparseLogisticRegression::UniqueKeys(batch),
            (std::vector<uint64_t>{3, 7, 42, 1000000000000ull}));
  EXPECT_TRUE(SparseLogisticRegression::UniqueKeys({}).empty());
}

TEST(SparseLr, EvaluateCountsCorrect) {
  std::vector<SparseExample> batch(2);
  batch[0] = {1.0f, {5}, {2.0f}};   // z = 2: predicts 1, correct
  batch[1] = {1.0f, {5}, {-2.0f}};  // z = -2: predicts 0, wrong
  const std::vector<uint64_t> keys = {5};
  const std::vector<float> w = {1.0f};
  const EvalResult r = SparseLogisticRegression::Evaluate(batch, keys, w, 0.0f);
  EXPECT_EQ(r.rows, 2);
  EXPECT_EQ(r.correct, 1);
  EXPECT_NEAR(r.loss_sum,
              std::log1p(std::exp(-2.0)) + std::log1p(std::exp(2.0)), 1e-5);
}

}  // namespace
}  // namespace tether
