// Connecting: what a client says when its coordinator's name is wrong.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "worker/client.h"

namespace tether {
namespace {

// A name that does not resolve is retried (a Kubernetes pod's DNS name
// appears only once the pod is scheduled) until the connect timeout, and
// the error then says the name did not resolve.
TEST(Connect, UnresolvableHostIsRetriedUntilTheTimeoutSayingSo) {
  ClientOptions o;
  // .invalid never resolves (RFC 2606).
  o.coordinator = "no-such-host.invalid:7070";
  o.connect_timeout_ms = 1500;
  const auto start = std::chrono::steady_clock::now();
  auto client = Client::Connect(o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), Code::kUnavailable);
  const std::string& m = client.status().message();
  EXPECT_NE(m.find("'no-such-host.invalid' does not resolve"),
            std::string::npos)
      << m;
  // Retried for the connect timeout, not given up at once nor forever.
  EXPECT_GE(seconds, 1.4) << m;
  EXPECT_LT(seconds, 10.0) << m;
}

}  // namespace
}  // namespace tether
