// What the processes of a run say, and how often: a worker waiting for
// the others says whom it waits for; each join and each checkpoint round is
// one line of shard 0's log; a browser leaving the dashboard is not news;
// tether-up counts epochs as tether-worker does. Real shards, workers and
// tether-up on loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/cluster.h"
#include "tools/http_client.h"
#include "worker/client.h"

namespace tether::testing {
namespace {

namespace json = boost::json;

// The lines of `log` that match `pattern`.
std::vector<std::string> Lines(const std::string& log,
                               const std::regex& pattern) {
  std::vector<std::string> found;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, pattern)) found.push_back(line);
  }
  return found;
}

// The first worker of a two-worker run waits for the second: it says so,
// with the count, and not that a pull waits for the slowest worker.
TEST(Joining, WaitingWorkerSaysHowManyMoreMustJoin) {
  TempDir dir;
  ClusterOptions o;
  o.workers = 2;
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto connect = [&] {
    ClientOptions co;
    co.coordinator = (*cluster)->coordinator();
    co.heartbeat_ms = 200;
    co.slow_request_ms = 1000;
    co.join_timeout_ms = 20000;
    return Client::Connect(co);
  };
  ::testing::internal::CaptureStderr();
  auto first = std::async(std::launch::async, connect);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto second = connect();
  auto first_client = first.get();
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(first_client.ok()) << first_client.status().ToString();
  EXPECT_NE(said.find("waiting for 1 more worker to join (1/2)"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("staleness bound"), std::string::npos) << said;
}

// Each worker's join and each checkpoint round is one line of shard 0's
// log, though the dashboard records both as events too.
TEST(Logs, JoinsAndCheckpointRoundsAreLoggedOnce) {
  TempDir dir;
  ClusterOptions o;
  o.workers = 2;
  o.extra_flags = {"--checkpoint-every", "50", "--dashboard-interval-ms",
                   "100"};
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = StartWorkers((*cluster)->coordinator(), 2, dir.path(),
                              {"--model", "softmax", "--epochs", "1", "--batch",
                               "128", "--eval-every", "0"});
  for (auto& w : workers) {
    auto code = w->Wait(120000);
    ASSERT_TRUE(code.ok() && *code == 0) << Tail(w->Log(), 10);
  }
  // The dashboard has seen both join and finish (its events are in).
  std::string events;
  ASSERT_TRUE(Eventually(
      [&] {
        auto r = HttpFetch((*cluster)->dashboard(), "GET", "/api/events");
        if (!r.ok() || r->status != 200) return false;
        events = r->body;
        return events.find("worker 0 (") != std::string::npos &&
               events.find("worker 1 (") != std::string::npos &&
               events.find(" finished") != std::string::npos &&
               events.find("checkpoint round") != std::string::npos;
      },
      10000))
      << events;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string log = (*cluster)->shard(0).Log();
  for (int rank = 0; rank < 2; ++rank) {
    const std::regex joined("\\] worker " + std::to_string(rank) +
                            " (\\([^)]*\\) )?(re)?joined");
    EXPECT_EQ(Lines(log, joined).size(), 1u) << "worker " << rank << ":\n"
                                             << log;
  }
  std::map<std::string, int> rounds;
  for (const std::string& line :
       Lines(log, std::regex("checkpoint round [0-9]+ complete"))) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, std::regex("round ([0-9]+)")));
    ++rounds[m[1]];
  }
  ASSERT_FALSE(rounds.empty()) << log;
  for (const auto& [round, lines] : rounds) {
    EXPECT_EQ(lines, 1) << "round " << round << ":\n" << log;
  }
}

// A raw WebSocket client of shard 0's dashboard that leaves the ways
// browsers do.
class DashboardSocket {
 public:
  explicit DashboardSocket(const std::string& address) {
    const size_t colon = address.rfind(':');
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(std::stoi(address.substr(colon + 1)));
    inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      return;
    }
    const std::string upgrade =
        "GET /ws HTTP/1.1\r\nHost: " + address +
        "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n";
    if (write(fd_, upgrade.data(), upgrade.size()) !=
        static_cast<ssize_t>(upgrade.size())) {
      return;
    }
    // The 101 and then the greeting: wait for some of the greeting.
    std::string got;
    char buffer[4096];
    while (got.find("\r\n\r\n") == std::string::npos ||
           got.size() < got.find("\r\n\r\n") + 8) {
      const ssize_t n = read(fd_, buffer, sizeof buffer);
      if (n <= 0) return;
      got.append(buffer, n);
    }
    upgraded_ = got.rfind("HTTP/1.1 101", 0) == 0;
    sockaddr_in self{};
    socklen_t len = sizeof self;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&self), &len);
    port_ = ntohs(self.sin_port);
  }
  ~DashboardSocket() {
    if (fd_ >= 0) close(fd_);
  }

  bool upgraded() const { return upgraded_; }
  int port() const { return port_; }

  // A close frame (masked, as from a client), then the connection reset at
  // once, as a closing tab does.
  void CloseFrameThenReset() {
    const unsigned char frame[] = {0x88, 0x82, 1, 2, 3, 4, 0x03 ^ 1, 0xe9 ^ 2};
    (void)!write(fd_, frame, sizeof frame);
    Reset();
  }
  // The connection reset with nothing said.
  void Reset() {
    linger hard{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    close(fd_);
    fd_ = -1;
  }
  // End of stream, with nothing said.
  void Finish() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool upgraded_ = false;
  int port_ = 0;
};

// A browser closing the dashboard's tab (a close frame and a reset, a bare
// reset, or an end of stream) is logged at debug, never at info.
TEST(Logs, BrowserLeavingTheDashboardIsLoggedAtDebugOnly) {
  TempDir dir;
  ClusterOptions o;
  o.extra_flags = {"--verbose"};
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  Process& shard = (*cluster)->shard(0);
  const std::string address = (*cluster)->dashboard();
  for (int how = 0; how < 3; ++how) {
    DashboardSocket ws(address);
    ASSERT_TRUE(ws.upgraded()) << shard.Log();
    const std::string client =
        "dashboard client 127.0.0.1:" + std::to_string(ws.port()) + " ";
    if (how == 0) ws.CloseFrameThenReset();
    if (how == 1) ws.Reset();
    if (how == 2) ws.Finish();
    ASSERT_TRUE(shard.WaitForLine(client, 10000).ok()) << "way " << how << ":\n"
                                                       << shard.Log();
  }
  // A plain HTTP connection reset after a request.
  ASSERT_TRUE(HttpFetch(address, "GET", "/api/status").ok());
  const std::string log = shard.Log();
  const auto told = Lines(
      log, std::regex("^[IWE] .*(dashboard client|closed the connection)"));
  EXPECT_TRUE(told.empty()) << told.front() << "\n" << log;
  EXPECT_FALSE(Lines(log, std::regex("^D .*dashboard client")).empty()) << log;
}

// tether-up's progress line counts epochs from 1, as tether-worker does:
// "epoch 2/2" at the end of a two-epoch run, never "epoch 0/".
TEST(Training, LauncherCountsEpochsFromOne) {
  TempDir dir;
  std::string output;
  auto code =
      RunToExit({TETHER_UP_BIN, "--http", "off", "--shards", "1", "--workers",
                 "2", "--slow", "0", "--model", "softmax", "--epochs", "2",
                 "--target-accuracy", "0", "--log-dir", dir.path()},
                &output, 120000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  ASSERT_EQ(*code, 0) << output;
  const auto lines = Lines(output, std::regex(" epoch [-0-9]+/2 "));
  ASSERT_FALSE(lines.empty()) << output;
  EXPECT_NE(lines.back().find(" epoch 2/2 "), std::string::npos) << output;
  EXPECT_EQ(output.find(" epoch 0/"), std::string::npos) << output;
  EXPECT_EQ(output.find(" epoch 3/"), std::string::npos) << output;
  // Each worker's own last line says the same.
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir.path() + "/worker" + std::to_string(rank) + ".log");
    const std::string log((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
    EXPECT_NE(log.find("epoch 2/2 "), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace tether::testing
