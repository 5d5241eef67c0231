// Test support: several in-process worker Clients of one cluster. Each
// Connect blocks until every worker has joined, so they connect together.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "worker/client.h"

namespace tether::testing {

// Connects `n` workers asking for bounds `staleness[i]`, their options
// changed by `adjust` where given; fails the test (returning an empty
// vector) if any cannot connect.
inline std::vector<std::unique_ptr<Client>> ConnectWorkers(
    const std::string& coordinator, const std::vector<int>& staleness,
    const std::function<void(ClientOptions&)>& adjust = {}) {
  std::vector<std::future<Result<std::unique_ptr<Client>>>> pending;
  for (int s : staleness) {
    pending.push_back(std::async(std::launch::async, [=] {
      ClientOptions o;
      o.coordinator = coordinator;
      o.staleness = s;
      o.join_timeout_ms = 20000;
      if (adjust) adjust(o);
      return Client::Connect(o);
    }));
  }
  std::vector<std::unique_ptr<Client>> clients;
  for (auto& p : pending) {
    auto c = p.get();
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return {};
    clients.push_back(std::move(*c));
  }
  // Sort by rank so tests can name workers by index.
  std::sort(clients.begin(), clients.end(),
            [](const auto& a, const auto& b) { return a->rank() < b->rank(); });
  return clients;
}

// An observer Client of the cluster at `coordinator` (null on failure,
// which fails the test), with `key_file` as its --auth-key-file.
inline std::unique_ptr<Client> ConnectObserver(
    const std::string& coordinator, const std::string& key_file = "") {
  ClientOptions o;
  o.coordinator = coordinator;
  o.observer = true;
  o.name = "test observer";
  o.auth_key_file = key_file;
  o.connect_timeout_ms = 5000;
  o.join_timeout_ms = 20000;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Starts an asynchronous call and returns a future of its Status.
template <typename Start>
std::future<Status> Async(Start start) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  start([promise](const Status& s) { promise->set_value(s); });
  return future;
}

inline bool Ready(std::future<Status>& f, int ms) {
  return f.wait_for(std::chrono::milliseconds(ms)) == std::future_status::ready;
}

}  // namespace tether::testing
