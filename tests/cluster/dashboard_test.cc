// The dashboard over real HTTP and WebSocket connections to a real shard 0,
// during real training runs (tether-worker processes on Fashion-MNIST).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "schema/flags.h"
#include "tests/support/cluster.h"
#include "tests/support/prometheus.h"
#include "tools/http_client.h"

namespace tether::testing {
namespace {

namespace json = boost::json;
using std::chrono::milliseconds;

class Dashboard : public ::testing::Test {
 protected:
  void StartCluster(int shards, int workers, std::vector<std::string> flags) {
    ClusterOptions o;
    o.shards = shards;
    o.workers = workers;
    o.extra_flags = std::move(flags);
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
  }
  void StartTraining(int workers, int epochs) {
    workers_ =
        StartWorkers(cluster_->coordinator(), workers, dir_.path(),
                     {"--model", "softmax", "--epochs", std::to_string(epochs),
                      "--report-every", "5", "--eval-every", "40"});
    ASSERT_EQ(static_cast<int>(workers_.size()), workers);
  }

  HttpReply Fetch(
      const std::string& method, const std::string& target,
      const std::string& body = "",
      std::vector<std::pair<std::string, std::string>> headers = {}) {
    auto reply =
        HttpFetch(cluster_->dashboard(), method, target, body, headers, 5000);
    EXPECT_TRUE(reply.ok())
        << method << " " << target << ": " << reply.status().ToString();
    return reply.ok() ? *reply : HttpReply{};
  }
  json::value GetJson(const std::string& target) {
    HttpReply reply = Fetch("GET", target);
    EXPECT_EQ(reply.status, 200) << target << ": " << reply.body;
    EXPECT_EQ(reply.content_type, "application/json") << target;
    boost::system::error_code ec;
    json::value v = json::parse(reply.body, ec);
    EXPECT_FALSE(ec) << target << " is not JSON: " << reply.body;
    return v;
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::unique_ptr<Process>> workers_;
};

// A sample's value in /metrics text; -1 when it is not there.
double Metric(const std::string& text, const std::string& name,
              const std::map<std::string, std::string>& labels) {
  return SampleValue(text, name, labels).value_or(-1);
}

int64_t Int(const json::value& v, const char* key) {
  return v.at(key).to_number<int64_t>();
}

TEST_F(Dashboard, EveryEndpointAnswersDuringARealRun) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(2, 2,
                   {"--dashboard-interval-ms", "100", "--seed", "77",
                    "--http-token-file", dir_.path() + "/dashboard.token"}));
  ASSERT_NO_FATAL_FAILURE(StartTraining(2, 10));

  // The page and its files, with a policy that loads nothing from elsewhere.
  HttpReply page = Fetch("GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("<html"), std::string::npos);
  EXPECT_NE(page.Header("Content-Security-Policy").find("default-src 'self'"),
            std::string::npos);
  EXPECT_EQ(Fetch("GET", "/app.js").content_type,
            "text/javascript; charset=utf-8");
  EXPECT_EQ(Fetch("GET", "/style.css").content_type, "text/css; charset=utf-8");

  // Training shows up: samples, history points with a loss, both shards.
  ASSERT_TRUE(Eventually(
      [&] {
        json::value status = GetJson("/api/status");
        json::value history = GetJson("/api/history");
        return Int(status, "samples") > 0 && Int(status, "min_clock") > 10 &&
               history.at("points").as_array().size() >= 3;
      },
      30000))
      << GetJson("/api/status");
  json::value status = GetJson("/api/status");
  EXPECT_EQ(Int(status, "shards"), 2);
  EXPECT_EQ(Int(status, "workers"), 2);
  EXPECT_EQ(Int(status, "shards_reporting"), 2);
  EXPECT_EQ(status.at("staleness_histogram").as_array().size(), 17u);

  json::array workers = GetJson("/api/workers").as_array();
  ASSERT_EQ(workers.size(), 2u);
  for (const json::value& w : workers) {
    std::string state(w.at("state").as_string());
    EXPECT_TRUE(state == "running" || state == "straggling" ||
                state == "finished")
        << w;
    EXPECT_FALSE(w.at("host").as_string().empty()) << w;
    EXPECT_EQ(w.at("device").as_string(), "cpu") << w;
  }
  ASSERT_TRUE(Eventually(
      [&] {
        json::array shards = GetJson("/api/shards").as_array();
        return shards.size() == 2 && shards[1].at("reporting").as_bool() &&
               Int(shards[0], "pushes") > 0 && Int(shards[1], "pushes") > 0;
      },
      10000))
      << GetJson("/api/shards");

  json::value config = GetJson("/api/config");
  EXPECT_EQ(Int(config, "seed"), 77);
  EXPECT_NE(std::string(config.at("command").as_string()).find("--seed 77"),
            std::string::npos);
  json::array points = GetJson("/api/history").at("points").as_array();
  double last_t = -1;
  for (const json::value& p : points) {
    EXPECT_GT(p.at("t").as_double(), last_t) << "history out of order";
    last_t = p.at("t").as_double();
  }
  EXPECT_TRUE(points.back().at("loss").is_double()) << points.back();
  std::string events = json::serialize(GetJson("/api/events"));
  // "worker 0 joined", or "worker 0 (HOST) joined" once its host is known.
  bool joined = false;
  const json::value event_doc = GetJson("/api/events");
  for (const json::value& e : event_doc.at("events").as_array()) {
    const std::string text(e.at("text").as_string());
    joined |= text.starts_with("worker 0 ") && text.ends_with(" joined");
  }
  EXPECT_TRUE(joined) << events;

  // A checkpoint round on demand needs the token: none, or a wrong one, is
  // refused (and logged, without the token).
  HttpReply anonymous = Fetch("POST", "/api/checkpoint");
  EXPECT_EQ(anonymous.status, 401) << anonymous.body;
  EXPECT_EQ(anonymous.Header("WWW-Authenticate"), "Bearer realm=\"tether\"");
  EXPECT_NE(anonymous.body.find("--http-token-file"), std::string::npos);
  HttpReply guessed =
      Fetch("POST", "/api/checkpoint", "",
            {{"Authorization", "Bearer " + std::string(64, 'a')}});
  EXPECT_EQ(guessed.status, 401) << guessed.body;
  EXPECT_TRUE(
      cluster_->shard(0)
          .WaitForLine("refused POST /api/checkpoint from 127.0.0.1:", 3000)
          .ok());
  std::ifstream token_file(dir_.path() + "/dashboard.token");
  std::string token;
  ASSERT_TRUE(std::getline(token_file, token)) << "no token file";
  ASSERT_EQ(token.size(), 64u);
  // With it: a round, shown complete (the cluster has data dirs).
  HttpReply started = Fetch("POST", "/api/checkpoint", "",
                            {{"Authorization", "Bearer " + token}});
  ASSERT_EQ(started.status, 202) << started.body;
  const int64_t round = Int(json::parse(started.body), "round");
  ASSERT_TRUE(Eventually(
      [&] {
        json::value checkpoints = GetJson("/api/checkpoints");
        for (const json::value& r : checkpoints.at("rounds").as_array()) {
          if (Int(r, "round") == round && r.at("status") == "complete") {
            return Int(r, "bytes") > 0;
          }
        }
        return false;
      },
      10000))
      << GetJson("/api/checkpoints");
  // Another site's page may not trigger one, even with the token.
  HttpReply forged = Fetch("POST", "/api/checkpoint", "",
                           {{"Origin", "http://evil.example"},
                            {"Authorization", "Bearer " + token}});
  EXPECT_EQ(forged.status, 403) << forged.body;

  // /metrics: valid exposition text with the run's figures in it.
  HttpReply metrics = Fetch("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(CheckExposition(metrics.body), "") << metrics.body;
  EXPECT_GT(Metric(metrics.body, "tether_shard_pushes_total", {{"shard", "1"}}),
            0);
  EXPECT_GT(Metric(metrics.body, "tether_worker_clock", {{"rank", "0"}}), 0);
  EXPECT_GE(Metric(metrics.body, "tether_checkpoint_rounds_total",
                   {{"status", "complete"}}),
            1);
  EXPECT_GE(Metric(metrics.body, "tether_checkpoint_write_seconds_count",
                   {{"shard", "1"}}),
            1);

  // Errors: short, with the right status.
  EXPECT_EQ(Fetch("GET", "/nope").status, 404);
  EXPECT_EQ(Fetch("GET", "/api/nope").status, 404);
  HttpReply wrong = Fetch("GET", "/api/checkpoint");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.Header("Allow"), "POST");
  EXPECT_EQ(Fetch("DELETE", "/metrics").status, 405);
  EXPECT_EQ(Fetch("GET", "/ws").status, 426);

  // A worker killed mid-run turns dead; the other goes on.
  workers_[1]->Signal(SIGKILL);
  ASSERT_TRUE(Eventually(
      [&] {
        int dead = 0;
        json::value workers = GetJson("/api/workers");
        for (const json::value& w : workers.as_array()) {
          dead += w.at("state") == "dead";
        }
        return dead == 1;
      },
      10000))
      << GetJson("/api/workers");
  std::string after_kill = json::serialize(GetJson("/api/events"));
  EXPECT_NE(after_kill.find("is dead"), std::string::npos) << after_kill;
  EXPECT_EQ(Metric(Fetch("GET", "/metrics").body,
                   "tether_worker_evictions_total", {}),
            1);

  // The token appears nowhere: not in a page, a document, /metrics or a log.
  for (const char* target :
       {"/", "/app.js", "/api/status", "/api/config", "/api/events",
        "/api/workers", "/api/checkpoints", "/metrics"}) {
    EXPECT_EQ(Fetch("GET", target).body.find(token), std::string::npos)
        << target;
  }
  for (int i = 0; i < cluster_->num_shards(); ++i) {
    EXPECT_EQ(cluster_->shard(i).Log().find(token), std::string::npos)
        << "shard " << i;
  }
}

// "Copy command + seeds" copies every process of the run: each shard with
// its own flags (shard 0's --listen the port it picked, which the others'
// --coordinator name), each worker with its own (one slowed down), and the
// key file's path, never the key.
TEST_F(Dashboard, ConfigListsTheCommandOfEveryShardAndWorker) {
  const std::string key = "never-shown-on-the-dashboard-0123456789";
  const std::string key_file = dir_.path() + "/run.key";
  std::ofstream(key_file) << key << "\n";
  chmod(key_file.c_str(), 0600);
  ClusterOptions o;
  o.shards = 2;
  o.workers = 2;
  o.seed = 77;
  o.extra_flags = {"--dashboard-interval-ms", "100"};
  o.shard_flags = {"--auth-key-file", key_file};
  auto c = Cluster::Start(o, dir_.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  cluster_ = std::move(*c);
  const std::string coordinator = cluster_->coordinator();
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> argv = {TETHER_WORKER_BIN, "--rank",
                                     std::to_string(rank)};
    argv.insert(argv.end(), {"--coordinator", coordinator, "--auth-key-file",
                             key_file, "--model", "softmax", "--batch", "32",
                             "--epochs", "1", "--eval-every", "0", "--quiet"});
    if (rank == 1) argv.insert(argv.end(), {"--slowdown", "3"});
    auto p = Process::Start(
        argv, dir_.path() + "/worker" + std::to_string(rank) + ".log");
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    workers_.push_back(std::move(*p));
  }

  json::value config;
  ASSERT_TRUE(Eventually(
      [&] {
        config = GetJson("/api/config");
        for (const json::value& p : config.at("commands").as_array()) {
          if (p.at("command").is_null()) return false;
        }
        return true;
      },
      20000))
      << config;
  const json::array& commands = config.at("commands").as_array();
  ASSERT_EQ(commands.size(), 4u) << config;
  auto command = [&](size_t i, const char* process) {
    EXPECT_EQ(commands[i].at("process"), process);
    return std::string(commands[i].at("command").as_string());
  };
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(" " + part + " ") != std::string::npos ||
           text.ends_with(" " + part);
  };
  const std::string key_flag = "--auth-key-file " + ShellQuote(key_file);

  const std::string shard0 = command(0, "shard 0");
  EXPECT_EQ(shard0.rfind(ShellQuote(TETHER_SERVER_BIN) + " ", 0), 0u) << shard0;
  for (const std::string& part :
       {std::string("--shard-id 0"), std::string("--shards 2"),
        std::string("--workers 2"), std::string("--seed 77"),
        "--listen " + coordinator, key_flag,
        "--data-dir " + ShellQuote(dir_.path() + "/shard0")}) {
    EXPECT_TRUE(has(shard0, part)) << part << " not in: " << shard0;
  }
  const std::string shard1 = command(1, "shard 1");
  for (const std::string& part :
       {std::string("--shard-id 1"), "--coordinator " + coordinator, key_flag,
        "--data-dir " + ShellQuote(dir_.path() + "/shard1")}) {
    EXPECT_TRUE(has(shard1, part)) << part << " not in: " << shard1;
  }
  const std::string worker0 = command(2, "worker 0");
  const std::string worker1 = command(3, "worker 1");
  EXPECT_EQ(worker0.rfind(ShellQuote(TETHER_WORKER_BIN) + " ", 0), 0u)
      << worker0;
  for (const std::string& w : {worker0, worker1}) {
    for (const std::string& part :
         {"--coordinator " + coordinator, key_flag,
          std::string("--model softmax"), std::string("--batch 32"),
          std::string("--epochs 1")}) {
      EXPECT_TRUE(has(w, part)) << part << " not in: " << w;
    }
  }
  EXPECT_TRUE(has(worker0, "--rank 0")) << worker0;
  EXPECT_TRUE(has(worker1, "--rank 1")) << worker1;
  EXPECT_FALSE(has(worker0, "--slowdown 3")) << worker0;
  EXPECT_TRUE(has(worker1, "--slowdown 3")) << worker1;

  // The text the button copies: one line per process, started together,
  // then `wait`; a script bash accepts.
  const std::string script(config.at("command").as_string());
  EXPECT_EQ(script, shard0 + " &\n" + shard1 + " &\n" + worker0 + " &\n" +
                        worker1 + " &\nwait");
  std::string output;
  auto parsed = RunToExit({"/bin/bash", "-n", "-c", script}, &output, 10000);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, 0) << output;
  EXPECT_EQ(json::serialize(config).find(key), std::string::npos);
}

TEST_F(Dashboard, WebSocketSendsSnapshotThenOnlyNewPoints) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(1, 1, {"--dashboard-interval-ms", "50", "--seed", "5"}));
  // Without --http-token-file, POST endpoints are off, with or without a
  // token.
  HttpReply off = Fetch("POST", "/api/checkpoint", "",
                        {{"Authorization", "Bearer " + std::string(64, 'a')}});
  EXPECT_EQ(off.status, 403) << off.body;
  EXPECT_NE(off.body.find("--http-token-file"), std::string::npos) << off.body;
  auto ws = WebSocketClient::Connect(cluster_->dashboard(), "/ws", {});
  ASSERT_TRUE(ws.ok()) << ws.status().ToString();
  auto first = (*ws)->Read(5000);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  json::value snapshot = json::parse(*first);
  EXPECT_EQ(snapshot.at("type"), "snapshot");
  EXPECT_EQ(Int(snapshot.at("config"), "seed"), 5);
  for (const char* key :
       {"status", "workers", "shards", "checkpoints", "history", "events"}) {
    EXPECT_TRUE(snapshot.as_object().contains(key)) << key;
  }

  ASSERT_NO_FATAL_FAILURE(StartTraining(1, 2));
  std::vector<double> times;
  for (const json::value& p : snapshot.at("history").as_array()) {
    times.push_back(p.at("t").as_double());
  }
  int updates = 0, config_updates = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (times.size() < 5 && std::chrono::steady_clock::now() < deadline) {
    auto message = (*ws)->Read(5000);
    ASSERT_TRUE(message.ok()) << message.status().ToString();
    json::value update = json::parse(*message);
    ASSERT_EQ(update.at("type"), "update");
    // The config comes again only when it changed: the worker joined and
    // said how it was started.
    if (update.as_object().contains("config")) {
      ++config_updates;
      EXPECT_FALSE(
          update.at("config").at("commands").at(1).at("command").is_null())
          << update.at("config");
    }
    ++updates;
    for (const json::value& p : update.at("history").as_array()) {
      const double t = p.at("t").as_double();
      // Only new points: none repeats or goes back in time.
      if (!times.empty()) {
        EXPECT_GT(t, times.back());
      }
      times.push_back(t);
    }
  }
  EXPECT_GE(times.size(), 5u) << "after " << updates << " updates";
  EXPECT_LE(config_updates, 1);
  // Updates come every interval, many per second.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*ws)->Read(2000).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  // What the stream carried is what /api/history holds.
  json::array points = GetJson("/api/history").at("points").as_array();
  ASSERT_GE(points.size(), times.size());
  for (size_t i = 0; i < times.size(); ++i) {
    EXPECT_EQ(points[i].at("t").as_double(), times[i]) << "point " << i;
  }
  // A WebSocket from another site's page is refused.
  auto foreign = WebSocketClient::Connect(cluster_->dashboard(), "/ws",
                                          {.origin = "http://evil.example"});
  EXPECT_FALSE(foreign.ok());
}

// A raw TCP connection to the dashboard, for requests no client library
// would send. `from`: the address to connect from (on Linux all of 127/8 is
// loopback, so 127.0.0.2 is another client on the same host); empty: the
// kernel's choice.
class RawConnection {
 public:
  explicit RawConnection(const std::string& address,
                         const std::string& from = "") {
    auto hp = ParseHostPort(address, "dashboard");
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (!from.empty()) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      inet_pton(AF_INET, from.c_str(), &local.sin_addr);
      if (bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
        return;
      }
    }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(hp->port);
    inet_pton(AF_INET, hp->host.c_str(), &sa.sin_addr);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    timeval tv{0, 200 * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawConnection() { close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // What arrives until the server closes, for up to `timeout_ms`; sets
  // *closed when it did.
  std::string ReadUntilClosed(int timeout_ms, bool* closed) {
    std::string out;
    *closed = false;
    auto deadline = std::chrono::steady_clock::now() + milliseconds(timeout_ms);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        *closed = true;
        break;
      }
      if (n > 0) out.append(buf, n);
    }
    return out;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

TEST_F(Dashboard, LimitsHoldAndOtherClientsAreStillServed) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(1, 1,
                   {"--dashboard-interval-ms", "10", "--http-timeout-ms",
                    "1000", "--http-max-clients", "6", "--http-header-limit",
                    "1024", "--http-body-limit", "128", "--ws-queue", "4"}));
  const int64_t rss_before = ProcStatusKib(cluster_->shard(0).pid(), "VmRSS");

  // Oversized headers and bodies are refused by size.
  EXPECT_EQ(Fetch("GET", "/api/status", "", {{"X-Big", std::string(2000, 'x')}})
                .status,
            431);
  EXPECT_EQ(Fetch("POST", "/api/checkpoint", std::string(1000, 'x')).status,
            413);
  // Bytes that are not HTTP: 400, then the connection is closed.
  {
    RawConnection raw(cluster_->dashboard());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.Send("\x16\x03\x01 garbage\r\n\r\n"));
    bool closed = false;
    std::string answer = raw.ReadUntilClosed(3000, &closed);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
    EXPECT_TRUE(closed);
  }
  // Slowloris: a request dribbled a byte at a time is cut off at the
  // timeout, while another client is served meanwhile.
  {
    RawConnection slow(cluster_->dashboard());
    ASSERT_TRUE(slow.connected());
    ASSERT_TRUE(slow.Send("GET / HTTP/1.1\r\nHost: x\r\n"));
    auto start = std::chrono::steady_clock::now();
    bool closed = false;
    for (int i = 0; i < 30 && !closed; ++i) {
      slow.Send("X");
      slow.ReadUntilClosed(100, &closed);
      if (i == 3) {
        EXPECT_EQ(Fetch("GET", "/api/status").status, 200);
      }
    }
    EXPECT_TRUE(closed) << "a dribbling client was not cut off";
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              std::chrono::seconds(3));
  }

  // A WebSocket client that never reads is dropped (its queue fills, or it
  // stops answering pings); one that reads keeps getting updates.
  auto healthy = WebSocketClient::Connect(cluster_->dashboard(), "/ws", {});
  ASSERT_TRUE(healthy.ok()) << healthy.status().ToString();
  auto stalled = WebSocketClient::Connect(
      cluster_->dashboard(), "/ws", {.origin = "", .receive_buffer = 4096});
  ASSERT_TRUE(stalled.ok()) << stalled.status().ToString();
  bool dropped = false;
  for (int i = 0; i < 1000 && !dropped; ++i) {
    ASSERT_TRUE((*healthy)->Read(2000).ok()) << "the reading client starved";
    if (i % 50 == 49) {
      dropped = Metric(Fetch("GET", "/metrics").body,
                       "tether_dashboard_dropped_clients_total", {}) >= 1;
    }
  }
  EXPECT_TRUE(dropped) << "a client that never reads was kept";
  ASSERT_TRUE((*healthy)->Read(2000).ok());
  (*stalled)->Close();

  // None of it made the shard hold on to memory.
  const int64_t rss_after = ProcStatusKib(cluster_->shard(0).pid(), "VmRSS");
  EXPECT_LT(rss_after, rss_before + 64 * 1024)
      << "RSS " << rss_before << " KiB -> " << rss_after << " KiB";
  EXPECT_TRUE(cluster_->shard(0).Running());
}

TEST_F(Dashboard, ClientsOverTheCapAreAnswered503) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(
      1, 1, {"--dashboard-interval-ms", "1000", "--http-max-clients", "3"}));
  std::vector<std::unique_ptr<WebSocketClient>> held;
  for (int i = 0; i < 3; ++i) {
    auto ws = WebSocketClient::Connect(cluster_->dashboard(), "/ws", {});
    ASSERT_TRUE(ws.ok()) << i << ": " << ws.status().ToString();
    held.push_back(std::move(*ws));
  }
  HttpReply refused = Fetch("GET", "/api/status");
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.body.find("--http-max-clients"), std::string::npos);
  // A place freed is taken again.
  held.pop_back();
  EXPECT_TRUE(Eventually(
      [&] { return Fetch("GET", "/api/status").status == 200; }, 5000));
  ASSERT_TRUE(held[0]->Read(3000).ok()) << "a held client lost its updates";
}

// Idle sockets from one address cannot take every place: past
// --http-max-clients-per-address (16 by default) that address is answered
// 503 at once and logged once, so as many idle sockets as the global cap
// from it leave room for others: another address is served at once, not
// 503 for the whole --http-timeout-ms.
TEST_F(Dashboard, OneAddressCannotTakeEveryPlace) {
  constexpr int kPerAddress = 16, kCap = 20;
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(1, 1,
                   {"--dashboard-interval-ms", "1000", "--http-timeout-ms",
                    "20000", "--http-max-clients", std::to_string(kCap)}));
  const std::string kHog = "127.0.0.2";
  // Accepted in order: the first 16 hold places, the rest find them held.
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < kCap; ++i) {
    idle.push_back(
        std::make_unique<RawConnection>(cluster_->dashboard(), kHog));
    ASSERT_TRUE(idle.back()->connected()) << "connection " << i;
  }
  for (int i = kPerAddress; i < kCap; ++i) {
    bool closed = false;
    std::string answer = idle[i]->ReadUntilClosed(3000, &closed);
    EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << i << ": " << answer;
    EXPECT_NE(answer.find("from " + kHog + " (--http-max-clients-per-address)"),
              std::string::npos)
        << answer;
    EXPECT_TRUE(closed) << i << ": a connection over the cap was kept";
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Fetch("GET", "/api/status").status, 200);
  EXPECT_EQ(Fetch("GET", "/metrics").status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  idle.resize(kPerAddress);

  // Logged naming the address, once for all its refusals.
  ASSERT_TRUE(
      cluster_->shard(0)
          .WaitForLine("connections open from " + kHog +
                           " (--http-max-clients-per-address); refusing more",
                       3000)
          .ok());
  const std::string log = cluster_->shard(0).Log();
  EXPECT_EQ(log.find("refusing more from it"),
            log.rfind("refusing more from it"))
      << "logged for every refusal";

  // A place it gives back, it may take again.
  idle.pop_back();
  EXPECT_TRUE(Eventually(
      [&] {
        RawConnection again(cluster_->dashboard(), kHog);
        again.Send(
            "GET /api/status HTTP/1.1\r\nHost: x\r\nConnection: "
            "close\r\n\r\n");
        bool closed = false;
        return again.ReadUntilClosed(2000, &closed).rfind("HTTP/1.1 200", 0) ==
               0;
      },
      5000));
}

// Every 403 is logged like a 401: the client's address and why.
TEST_F(Dashboard, RefusalsAreLoggedWithTheClientsAddress) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(1, 1, {"--dashboard-interval-ms", "1000"}));  // no token
  Process& shard = cluster_->shard(0);

  EXPECT_EQ(Fetch("POST", "/api/checkpoint").status, 403);
  auto off = shard.WaitForLine("(no --http-token-file)", 3000);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_NE(off->find("refused POST /api/checkpoint from 127.0.0.1:"),
            std::string::npos)
      << *off;

  EXPECT_EQ(Fetch("POST", "/api/stop", "", {{"Origin", "http://evil.example"}})
                .status,
            403);
  auto forged = shard.WaitForLine("(Origin http://evil.example)", 3000);
  ASSERT_TRUE(forged.ok()) << forged.status().ToString();
  EXPECT_NE(forged->find("refused POST /api/stop from 127.0.0.1:"),
            std::string::npos)
      << *forged;
  EXPECT_NE(forged->find("cross-origin"), std::string::npos) << *forged;

  auto ws = WebSocketClient::Connect(cluster_->dashboard(), "/ws",
                                     {.origin = "http://other.example"});
  EXPECT_FALSE(ws.ok());
  auto foreign = shard.WaitForLine("(Origin http://other.example)", 3000);
  ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
  EXPECT_NE(foreign->find("refused WebSocket /ws from 127.0.0.1:"),
            std::string::npos)
      << *foreign;
  EXPECT_NE(foreign->find("cross-origin"), std::string::npos) << *foreign;
}

TEST_F(Dashboard, StopEndsTheRunAndEveryWorkerExitsCleanly) {
  const std::string token_file = dir_.path() + "/dashboard.token";
  ASSERT_NO_FATAL_FAILURE(StartCluster(
      2, 2,
      {"--dashboard-interval-ms", "100", "--http-token-file", token_file}));
  ASSERT_NO_FATAL_FAILURE(StartTraining(2, 50));
  ASSERT_TRUE(Eventually(
      [&] { return Int(GetJson("/api/status"), "min_clock") >= 5; }, 20000))
      << GetJson("/api/status");
  EXPECT_EQ(Fetch("POST", "/api/stop").status, 401);
  std::ifstream in(token_file);
  std::string token;
  ASSERT_TRUE(std::getline(in, token));
  const std::vector<std::pair<std::string, std::string>> auth = {
      {"Authorization", "Bearer " + token}};
  HttpReply stopped = Fetch("POST", "/api/stop", "", auth);
  ASSERT_EQ(stopped.status, 202) << stopped.body;
  json::value answer = json::parse(stopped.body);
  EXPECT_EQ(Int(answer, "workers"), 2) << stopped.body;
  EXPECT_TRUE(answer.at("round").is_int64()) << stopped.body;  // --data-dir

  // Each worker stops after its step, reports, evaluates and exits 0, long
  // before its 50 epochs.
  for (size_t r = 0; r < workers_.size(); ++r) {
    auto code = workers_[r]->Wait(30000);
    ASSERT_TRUE(code.ok()) << "worker " << r << " did not stop";
    EXPECT_EQ(*code, 0) << Tail(workers_[r]->Log(), 10);
    EXPECT_NE(workers_[r]->Log().find("stopping at clock"), std::string::npos)
        << Tail(workers_[r]->Log(), 10);
  }
  json::value status = GetJson("/api/status");
  EXPECT_EQ(status.at("state"), "stopped") << status;
  EXPECT_NE(json::serialize(GetJson("/api/events"))
                .find("run stopped from the dashboard"),
            std::string::npos);
  // The shards keep serving; a late worker is refused, saying why, and a
  // second stop changes nothing.
  for (int i = 0; i < cluster_->num_shards(); ++i) {
    EXPECT_TRUE(cluster_->shard(i).Running()) << "shard " << i;
  }
  std::string output;
  auto late =
      RunToExit({TETHER_WORKER_BIN, "--coordinator", cluster_->coordinator(),
                 "--model", "softmax", "--quiet"},
                &output, 30000);
  ASSERT_TRUE(late.ok());
  EXPECT_NE(*late, 0);
  EXPECT_NE(output.find("the run was stopped"), std::string::npos) << output;
  EXPECT_EQ(Fetch("POST", "/api/stop", "", auth).status, 409);
}

// ---------------------------------------------------------------------------
// What the dashboard says about workers (web/API.md), against real runs

// Starts tether-worker `rank` with `flags` (its log: DIR/workerR.log); null,
// failing the test, when it cannot be started.
std::unique_ptr<Process> StartWorker(const std::string& coordinator, int rank,
                                     const std::string& dir,
                                     const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {TETHER_WORKER_BIN,    "--coordinator",
                                   coordinator,          "--rank",
                                   std::to_string(rank), "--quiet"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto p =
      Process::Start(argv, dir + "/worker" + std::to_string(rank) + ".log");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

constexpr int kSlowedRank = 2;

// Three workers training under bound `staleness`, rank kSlowedRank 8 times
// slower than the others (sleeping 7 times its compute time each step).
std::vector<std::unique_ptr<Process>> StartOneSlowedOfThree(
    const std::string& coordinator, const std::string& dir, int staleness) {
  const std::vector<std::string> flags = {
      "--model",      "softmax", "--epochs",       "100",
      "--batch",      "256",     "--staleness",    std::to_string(staleness),
      "--eval-every", "0",       "--report-every", "5"};
  std::vector<std::unique_ptr<Process>> workers;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<std::string> own = flags;
    if (rank == kSlowedRank) own.insert(own.end(), {"--slowdown", "8"});
    workers.push_back(StartWorker(coordinator, rank, dir, own));
  }
  return workers;
}

TEST_F(Dashboard, OnlyTheSlowedWorkerIsStraggling) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(1, 3, {"--dashboard-interval-ms", "100"}));
  workers_ = StartOneSlowedOfThree(cluster_->coordinator(), dir_.path(), 2);
  ASSERT_TRUE(Eventually(
      [&] { return GetJson("/api/status").at("state") == "running"; }, 30000))
      << GetJson("/api/status");

  // Every 100 ms for 10 s, from the moment everyone joined: straggling
  // needs 3 s of evidence, after which the slowed worker shows it.
  int slowed_straggling = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    const json::value workers = GetJson("/api/workers");
    for (const json::value& w : workers.as_array()) {
      if (w.at("state") != "straggling") continue;
      EXPECT_GE(Int(w, "lag"), 1) << "straggling 0 clocks behind: " << w;
      if (Int(w, "rank") == kSlowedRank) {
        ++slowed_straggling;
      } else {
        ADD_FAILURE() << "an unslowed worker straggles: " << workers;
      }
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_GT(slowed_straggling, 10) << "the slowed worker was seen straggling "
                                   << slowed_straggling << " times";

  // The events agree: only the slowed worker, never 0 clocks behind.
  int warned = 0;
  const json::value events = GetJson("/api/events");
  for (const json::value& e : events.at("events").as_array()) {
    const std::string text(e.at("text").as_string());
    if (text.find("straggling") == std::string::npos) continue;
    ++warned;
    EXPECT_TRUE(text.starts_with("worker " + std::to_string(kSlowedRank)))
        << text;
    EXPECT_EQ(text.find(" 0 clocks"), std::string::npos) << text;
    EXPECT_EQ(e.at("level"), "warning") << text;
  }
  EXPECT_GE(warned, 1) << events;
  // Shard 0 logs the same warnings, and none for another worker.
  int logged = 0;
  for (const std::string& line : Lines(cluster_->shard(0).Log())) {
    if (line.find("straggling") == std::string::npos) continue;
    ++logged;
    EXPECT_TRUE(line.starts_with("W ")) << line;
    EXPECT_NE(line.find("] worker " + std::to_string(kSlowedRank) + " "),
              std::string::npos)
        << line;
  }
  EXPECT_GE(logged, warned);
}

// Under bound s a push may be s + 1 stale and a worker s + 1 behind, never
// more (web/API.md, "Clocks, staleness and lag"); with one worker much
// slower than the others, both reach s + 1.
TEST_F(Dashboard, PushStalenessAndLagNeverExceedTheBoundPlusOne) {
  constexpr int kBound = 1;
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(2, 3, {"--dashboard-interval-ms", "100"}));
  workers_ =
      StartOneSlowedOfThree(cluster_->coordinator(), dir_.path(), kBound);
  ASSERT_TRUE(Eventually(
      [&] { return GetJson("/api/status").at("state") == "running"; }, 30000))
      << GetJson("/api/status");

  int64_t max_lag = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    const json::value workers = GetJson("/api/workers");
    for (const json::value& w : workers.as_array()) {
      EXPECT_EQ(Int(w, "staleness_bound"), kBound) << w;
      if (w.at("state") == "running" || w.at("state") == "straggling") {
        EXPECT_LE(Int(w, "lag"), kBound + 1) << w;
        max_lag = std::max(max_lag, Int(w, "lag"));
      }
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(max_lag, kBound + 1);

  const json::value status = GetJson("/api/status");
  const json::array& histogram = status.at("staleness_histogram").as_array();
  ASSERT_EQ(histogram.size(), 17u);
  for (size_t i = kBound + 2; i < histogram.size(); ++i) {
    EXPECT_EQ(histogram[i], 0) << "pushes " << i << " clocks stale: " << status;
  }
  EXPECT_GT(histogram[kBound + 1].to_number<int64_t>(), 0) << status;
  EXPECT_GT(histogram[0].to_number<int64_t>(), 0) << status;
}

// Workers that end normally are "finished", at info level, in the events
// and in shard 0's log: tether-worker after its epochs, tether-client
// train after its iterations. Neither is "dead".
TEST_F(Dashboard, WorkersThatEndNormallyAreFinishedNotDead) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(2, 3, {"--dashboard-interval-ms", "100"}));
  std::vector<std::unique_ptr<Process>> all;
  for (int rank = 0; rank < 2; ++rank) {
    all.push_back(StartWorker(cluster_->coordinator(), rank, dir_.path(),
                              {"--model", "softmax", "--epochs", "1"}));
  }
  auto client = Process::Start(
      {TETHER_CLIENT_BIN, "train", "--coordinator", cluster_->coordinator(),
       "--rank", "2", "--shape", "100", "--iterations", "50", "--quiet"},
      dir_.path() + "/worker2.log");
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  all.push_back(std::move(*client));
  for (size_t rank = 0; rank < all.size(); ++rank) {
    auto code = all[rank]->Wait(60000);
    ASSERT_TRUE(code.ok()) << "worker " << rank << " did not end";
    ASSERT_EQ(*code, 0) << Tail(all[rank]->Log(), 10);
  }
  ASSERT_TRUE(Eventually(
      [&] {
        const json::value workers = GetJson("/api/workers");
        for (const json::value& w : workers.as_array()) {
          // A worker that finished its epochs then leaves the run.
          if (w.at("state") != "finished" && w.at("state") != "left") {
            return false;
          }
        }
        return true;
      },
      10000))
      << GetJson("/api/workers");
  for (int rank = 0; rank < 3; ++rank) {
    const std::string who = "worker " + std::to_string(rank) + " ";
    bool logged = false;
    for (const std::string& l : Lines(cluster_->shard(0).Log())) {
      if (l.find(who) == std::string::npos) continue;
      EXPECT_EQ(l.find("dead"), std::string::npos) << l;
      if (l.ends_with(" finished")) {
        logged = true;
        EXPECT_TRUE(l.starts_with("I ")) << l;
      }
    }
    EXPECT_TRUE(logged) << who << "finished is not in shard 0's log";
  }
  const json::value events = GetJson("/api/events");
  for (const json::value& e : events.at("events").as_array()) {
    const std::string text(e.at("text").as_string());
    EXPECT_EQ(text.find("dead"), std::string::npos) << text;
    if (text.ends_with(" finished")) {
      EXPECT_EQ(e.at("level"), "info") << text;
    }
  }
}

}  // namespace
}  // namespace tether::testing
