// Connecting: what a client says when its coordinator's name is wrong.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "worker/client.h"

namespace tether {
namespace {

TEST(Connect, UnresolvableHostFailsAtOnceSayingSo) {
  ClientOptions o;
  // .invalid never resolves (RFC 2606).
  o.coordinator = "no-such-host.invalid:7070";
  o.connect_timeout_ms = 20000;
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
  // Not retried for the 20 s connect timeout.
  EXPECT_LT(seconds, 5.0) << m;
}

}  // namespace
}  // namespace tether
