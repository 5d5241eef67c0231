// Test support: a model's parameters pulled from a running cluster, and
// waiting for tether-worker processes to end, for tests that compare
// whole runs (resume, replay).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"

namespace tether::testing {

// By tensor name.
using Params = std::map<std::string, std::vector<float>>;
using Shapes = std::vector<std::pair<std::string, std::vector<uint64_t>>>;

// The tensors of tether-worker's --model mlp on Fashion-MNIST with one
// hidden layer of `hidden` units.
inline Shapes MlpShapes(uint64_t hidden) {
  return {{"fc1.weight", {hidden, 784}},
          {"fc1.bias", {hidden}},
          {"fc2.weight", {10, hidden}},
          {"fc2.bias", {10}}};
}

// Every tensor of `shapes`, pulled by an observer of the cluster at
// `coordinator`; empty when it cannot connect (the test fails).
inline Params PullParams(const std::string& coordinator, const Shapes& shapes) {
  auto observer = ConnectObserver(coordinator);
  Params params;
  if (observer == nullptr) return params;
  for (const auto& [name, shape] : shapes) {
    EXPECT_TRUE(observer->DefineTensor(name, shape).ok()) << name;
    uint64_t size = 1;
    for (uint64_t d : shape) size *= d;
    std::vector<float>& v = params[name];
    v.resize(size);
    EXPECT_TRUE(observer->Pull(name, v).ok()) << name;
  }
  return params;
}

// Waits for every worker to end (each within `timeout_ms`); each must exit
// 0, else the test fails with the tail of its log.
inline void WaitForWorkers(std::vector<std::unique_ptr<Process>>& workers,
                           int timeout_ms = 240000) {
  for (auto& w : workers) {
    auto code = w->Wait(timeout_ms);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 0) << Tail(w->Log(), 10);
  }
}

// Fails the test for every tensor of `expected` whose values in `got` are
// not the same bits, saying how many differ in `what`.
inline void ExpectBitIdentical(const Params& expected, const Params& got,
                               const std::string& what) {
  ASSERT_FALSE(expected.empty());
  for (const auto& [name, values] : expected) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    ASSERT_EQ(values.size(), it->second.size()) << name;
    size_t differ = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (std::memcmp(&values[i], &it->second[i], sizeof(float)) != 0) {
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0u) << name << ": " << differ << " of " << values.size()
                          << " values differ in " << what;
  }
}

}  // namespace tether::testing
