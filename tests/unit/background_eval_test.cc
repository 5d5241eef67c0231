#include "worker/background_eval.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace tether {
namespace {

// 40 rows of 12 features over 3 classes, drawn from `seed`.
DenseDataset SmallTestSet(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  DenseDataset d;
  d.rows = 40;
  d.features = 12;
  d.classes = 3;
  d.x.resize(d.rows * d.features);
  for (float& v : d.x) v = u(rng);
  for (size_t r = 0; r < d.rows; ++r) d.y.push_back(int32_t(rng() % 3));
  return d;
}

std::vector<std::vector<float>> RandomWeights(const DenseModel& model,
                                              uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<std::vector<float>> w;
  for (const ParamSpec& s : model.specs()) {
    w.emplace_back(s.size());
    for (float& v : w.back()) v = u(rng);
  }
  return w;
}

// An evaluation in the background gives what the model's own Evaluate
// gives on the weights handed to Start, however the trained model's
// weights change meanwhile, labelled with Start's clock.
TEST(BackgroundEvaluator, GivesTheForegroundResultOfTheWeightsItWasGiven) {
  const DenseDataset test = SmallTestSet(3);
  auto model = MakeMlp(12, {16}, 3, /*max_batch=*/8, /*threads=*/1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const auto first = RandomWeights(**model, 1);
  const auto second = RandomWeights(**model, 2);
  (*model)->weights() = second;
  auto expected_second =
      (*model)->Evaluate(test.x.data(), test.y.data(), test.rows);
  (*model)->weights() = first;
  auto expected_first =
      (*model)->Evaluate(test.x.data(), test.y.data(), test.rows);
  ASSERT_TRUE(expected_first.ok() && expected_second.ok());
  // Different weights, different figures: the comparison below can fail.
  ASSERT_NE(expected_first->loss_sum, expected_second->loss_sum);

  auto twin = (*model)->Twin();
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  BackgroundEvaluator evaluator(std::move(*twin), test);
  EXPECT_FALSE(evaluator.Take(/*wait=*/true).has_value());  // none started

  ASSERT_TRUE(evaluator.Start((*model)->weights(), 7).ok());
  (*model)->weights() = second;  // training goes on: the copy is evaluated
  EXPECT_TRUE(evaluator.pending());
  Status again = evaluator.Start((*model)->weights(), 8);
  EXPECT_EQ(again.code(), Code::kInternal) << again.ToString();

  auto done = evaluator.Take(/*wait=*/true);
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(evaluator.pending());
  EXPECT_EQ(done->clock, 7);
  ASSERT_TRUE(done->result.ok()) << done->result.status().ToString();
  EXPECT_EQ(done->result->rows, 40);
  EXPECT_EQ(done->result->correct, expected_first->correct);
  EXPECT_DOUBLE_EQ(done->result->loss_sum, expected_first->loss_sum);

  // The next one, polled until done, has the second weights.
  ASSERT_TRUE(evaluator.Start((*model)->weights(), 9).ok());
  std::optional<BackgroundEvaluator::Done> polled;
  while (!(polled = evaluator.Take(/*wait=*/false))) std::this_thread::yield();
  EXPECT_EQ(polled->clock, 9);
  ASSERT_TRUE(polled->result.ok());
  EXPECT_DOUBLE_EQ(polled->result->loss_sum, expected_second->loss_sum);

  // Left running: the destructor waits for it.
  ASSERT_TRUE(evaluator.Start((*model)->weights(), 10).ok());
}

// Weights of another shape are refused naming the buffer, and nothing is
// started.
TEST(BackgroundEvaluator, RefusesWeightsOfAnotherShape) {
  const DenseDataset test = SmallTestSet(4);
  auto model = MakeMlp(12, {16}, 3, 8, 1);
  ASSERT_TRUE(model.ok());
  auto twin = (*model)->Twin();
  ASSERT_TRUE(twin.ok());
  BackgroundEvaluator evaluator(std::move(*twin), test);
  auto weights = (*model)->weights();
  weights[2].pop_back();
  Status s = evaluator.Start(weights, 1);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("fc2.weight"), std::string::npos) << s.message();
  weights.pop_back();
  EXPECT_EQ(evaluator.Start(weights, 1).code(), Code::kInvalidArgument);
  EXPECT_FALSE(evaluator.pending());
}

}  // namespace
}  // namespace tether
