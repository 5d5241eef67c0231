// The dashboard over HTTPS and WSS (issue 17): a real shard 0 started with
// --tls-cert, --tls-key and --tls-ca serves its page, documents and
// WebSocket over TLS only, under the limits plain HTTP has, to clients
// that check its certificate against the run's CA.
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "schema/flags.h"
#include "tests/support/certs.h"
#include "tests/support/cluster.h"

namespace tether::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
namespace ssl = asio::ssl;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using HttpsStream = beast::ssl_stream<beast::tcp_stream>;
using Response = http::response<http::string_body>;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout(5000);  // for each client operation

tcp::endpoint EndpointOf(const std::string& address) {
  auto hp = ParseHostPort(address, "dashboard");
  EXPECT_TRUE(hp.ok()) << hp.status().ToString();
  return hp.ok() ? tcp::endpoint(asio::ip::make_address(hp->host), hp->port)
                 : tcp::endpoint();
}

// Runs `io` until what was started on it has finished.
void Run(asio::io_context& io) {
  io.restart();
  io.run();
}

Status Failed(const std::string& what, const beast::error_code& ec) {
  return Unavailable(what + ": " + ec.message());
}

// A TLS client of the dashboard that checks the server's certificate
// against `ca_file` and its name against "localhost" (make_certs.sh's
// SAN); every operation within kTimeout. One connection at a time.
class TlsClient {
 public:
  TlsClient(std::string address, const std::string& ca_file)
      : address_(std::move(address)) {
    ctx_.load_verify_file(ca_file);
    ctx_.set_verify_mode(ssl::verify_peer);
    ctx_.set_verify_callback(ssl::host_name_verification("localhost"));
  }

  // Connects and does the TLS handshake.
  Status Connect() {
    ws_.reset();
    ws_.emplace(io_, ctx_);
    beast::error_code result;
    Lowest().expires_after(kTimeout);
    Lowest().async_connect(EndpointOf(address_), [&](beast::error_code ec) {
      if (ec) {
        result = ec;
        return;
      }
      Tls().async_handshake(ssl::stream_base::client,
                            [&](beast::error_code ec) { result = ec; });
    });
    Run(io_);
    return result ? Failed("connect or TLS handshake", result) : Status::Ok();
  }

  // One request on the connection, which Connect() made.
  Result<Response> Fetch(
      const std::string& method, const std::string& target,
      const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    http::request<http::string_body> req(http::string_to_verb(method), target,
                                         11);
    req.set(http::field::host, address_);
    for (const auto& [name, value] : headers) req.set(name, value);
    req.prepare_payload();
    Response res;
    beast::flat_buffer buffer;
    beast::error_code result;
    Lowest().expires_after(kTimeout);
    http::async_write(Tls(), req, [&](beast::error_code ec, size_t) {
      if (ec) {
        result = ec;
        return;
      }
      http::async_read(Tls(), buffer, res,
                       [&](beast::error_code ec, size_t) { result = ec; });
    });
    Run(io_);
    if (result) return Failed(method + " " + target, result);
    return res;
  }

  // Upgrades the connection to a WebSocket on /ws, sending `origin`
  // unless it is empty.
  Status Upgrade(const std::string& origin) {
    Lowest().expires_never();
    ws_->set_option(
        websocket::stream_base::timeout::suggested(beast::role_type::client));
    ws_->set_option(websocket::stream_base::decorator(
        [origin](websocket::request_type& req) {
          if (!origin.empty()) req.set(http::field::origin, origin);
        }));
    beast::error_code result;
    bool done = false;
    ws_->async_handshake(address_, "/ws", [&](beast::error_code ec) {
      result = ec;
      done = true;
    });
    // Not until the io_context runs out of work: a declined handshake
    // leaves the stream's handshake timer waiting.
    io_.restart();
    while (!done && io_.run_one() > 0) {
    }
    return result ? Failed("WebSocket handshake", result) : Status::Ok();
  }

  // The next WebSocket message.
  Result<std::string> Read() {
    beast::flat_buffer buffer;
    beast::error_code result;
    asio::steady_timer timer(io_, kTimeout);
    timer.async_wait([&](beast::error_code ec) {
      if (!ec) Lowest().close();  // the read fails: timed out
    });
    ws_->async_read(buffer, [&](beast::error_code ec, size_t) {
      result = ec;
      timer.cancel();
    });
    Run(io_);
    if (result) return Failed("WebSocket read", result);
    return beast::buffers_to_string(buffer.data());
  }

 private:
  HttpsStream& Tls() { return ws_->next_layer(); }
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(*ws_); }

  const std::string address_;
  asio::io_context io_;
  ssl::context ctx_{ssl::context::tls_client};
  std::optional<websocket::stream<HttpsStream>> ws_;
};

// A plain TCP connection: sends `bytes` (none when empty) and returns what
// came back until the server closed it; kTimeout if it did not within
// `timeout`.
Result<std::string> PlainExchange(const std::string& address,
                                  const std::string& bytes,
                                  milliseconds timeout) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  std::string answer;
  beast::error_code result;
  stream.expires_after(timeout);
  stream.async_connect(EndpointOf(address), [&](beast::error_code ec) {
    if (ec) {
      result = ec;
      return;
    }
    asio::async_write(
        stream, asio::buffer(bytes), [&](beast::error_code ec, size_t) {
          if (ec) {
            result = ec;
            return;
          }
          asio::async_read(stream, asio::dynamic_buffer(answer),
                           [&](beast::error_code ec, size_t) { result = ec; });
        });
  });
  Run(io);
  if (result == beast::error::timeout) {
    return Status(Code::kTimeout, "the server kept the connection open");
  }
  if (result != asio::error::eof && result != asio::error::connection_reset) {
    return Failed("plain exchange", result);
  }
  return answer;
}

class Https : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = testing::TestCerts::Make(dir_.path() + "/certs");
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    certs_ = *made;
  }
  void TearDown() override {
    if (HasFailure() && shard_) {
      std::cerr << "shard 0's log:\n" << Tail(shard_->Log(), 30) << "\n";
    }
  }

  std::string Cert(const std::string& name) const { return certs_.File(name); }
  std::vector<std::string> TlsFlags() const { return certs_.Flags(); }

  // Starts shard 0 of a one-shard run of `workers`, with TLS and `flags`;
  // its dashboard must be an https:// one.
  void StartShard(const std::vector<std::string>& flags, int workers = 1) {
    std::vector<std::string> argv = {TETHER_SERVER_BIN,
                                     "--shard-id",
                                     "0",
                                     "--shards",
                                     "1",
                                     "--workers",
                                     std::to_string(workers),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--http",
                                     "127.0.0.1:0",
                                     "--ready-file",
                                     dir_.path() + "/shard0.ready"};
    for (const auto& list : {TlsFlags(), flags}) {
      argv.insert(argv.end(), list.begin(), list.end());
    }
    auto p = Process::Start(argv, dir_.path() + "/shard0.log");
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    shard_ = std::move(*p);
    auto ready = shard_->WaitForReady(dir_.path() + "/shard0.ready", 10000);
    ASSERT_TRUE(ready.ok()) << ready.status().ToString();
    const std::string& url = ready->dashboard;
    ASSERT_TRUE(url.starts_with("https://")) << url;
    dashboard_ = url.substr(8, url.find('/', 8) - 8);
    coordinator_ = ready->advertise;
    ASSERT_TRUE(shard_->WaitForLine("dashboard at " + url, 3000).ok());
  }

  Result<Response> Get(const std::string& target) {
    TlsClient client(dashboard_, Cert("ca.pem"));
    TETHER_RETURN_IF_ERROR(client.Connect());
    return client.Fetch("GET", target);
  }

  TempDir dir_;
  testing::TestCerts certs_;
  std::unique_ptr<Process> shard_;
  std::string dashboard_;    // HOST:PORT
  std::string coordinator_;  // HOST:PORT
};

int64_t Int(const json::value& v, const char* key) {
  return v.at(key).to_number<int64_t>();
}

TEST_F(Https, PageDocumentsAndWebSocketOverTls) {
  ASSERT_NO_FATAL_FAILURE(
      StartShard({"--dashboard-interval-ms", "100", "--http-token-file",
                  dir_.path() + "/dashboard.token"}));
  auto workers = StartWorkers(coordinator_, 1, dir_.path(), [&] {
    std::vector<std::string> f = TlsFlags();
    for (const char* s : {"--model", "softmax", "--epochs", "2",
                          "--report-every", "5", "--eval-every", "40"}) {
      f.push_back(s);
    }
    return f;
  }());
  ASSERT_EQ(workers.size(), 1u);

  // The page, and a document, the certificate checked against the run's CA.
  auto page = Get("/");
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_EQ(page->result_int(), 200);
  EXPECT_NE(page->body().find("<html"), std::string::npos);
  auto status = Get("/api/status");
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(status->result_int(), 200);
  EXPECT_EQ((*status)[http::field::content_type], "application/json");
  EXPECT_EQ(Int(json::parse(status->body()), "shards"), 1);

  // Keep-alive: several requests on one TLS connection.
  {
    TlsClient client(dashboard_, Cert("ca.pem"));
    ASSERT_TRUE(client.Connect().ok());
    for (const char* target : {"/api/config", "/api/workers", "/metrics"}) {
      auto r = client.Fetch("GET", target);
      ASSERT_TRUE(r.ok()) << target << ": " << r.status().ToString();
      EXPECT_EQ(r->result_int(), 200) << target;
    }
  }

  // A client that trusts another CA refuses the server's certificate.
  {
    TlsClient stranger(dashboard_, Cert("other-ca.pem"));
    Status s = stranger.Connect();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("certificate verify failed"), std::string::npos)
        << s.ToString();
  }

  // The page's own origin is https://HOST: a POST from it is judged on its
  // token (none here: 401), one from another origin is refused (403).
  {
    TlsClient client(dashboard_, Cert("ca.pem"));
    ASSERT_TRUE(client.Connect().ok());
    auto same = client.Fetch("POST", "/api/checkpoint",
                             {{"Origin", "https://" + dashboard_}});
    ASSERT_TRUE(same.ok()) << same.status().ToString();
    EXPECT_EQ(same->result_int(), 401) << same->body();
    auto foreign = client.Fetch("POST", "/api/checkpoint",
                                {{"Origin", "http://" + dashboard_}});
    ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
    EXPECT_EQ(foreign->result_int(), 403) << foreign->body();
  }

  // WSS from the page's origin: the snapshot, then updates every interval
  // with the training's points in them.
  TlsClient ws(dashboard_, Cert("ca.pem"));
  ASSERT_TRUE(ws.Connect().ok());
  ASSERT_TRUE(ws.Upgrade("https://" + dashboard_).ok());
  auto first = ws.Read();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(json::parse(*first).at("type"), "snapshot");
  size_t points = json::parse(*first).at("history").as_array().size();
  int updates = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (points < 3 && std::chrono::steady_clock::now() < deadline) {
    auto message = ws.Read();
    ASSERT_TRUE(message.ok()) << message.status().ToString();
    json::value update = json::parse(*message);
    ASSERT_EQ(update.at("type"), "update");
    ++updates;
    points += update.at("history").as_array().size();
  }
  EXPECT_GE(points, 3u) << "after " << updates << " updates";

  // A WebSocket from a page served over plain HTTP is another origin.
  TlsClient foreign(dashboard_, Cert("ca.pem"));
  ASSERT_TRUE(foreign.Connect().ok());
  EXPECT_FALSE(foreign.Upgrade("http://" + dashboard_).ok());
  EXPECT_TRUE(shard_->WaitForLine("refused WebSocket /ws from", 3000).ok());
}

// A client that speaks plain HTTP to the HTTPS port gets no HTTP answer:
// the connection is closed and the reason logged with its address. The
// server goes on serving TLS clients.
TEST_F(Https, PlainHttpGetsNoAnswerAndIsLogged) {
  ASSERT_NO_FATAL_FAILURE(StartShard({}));
  auto answer = PlainExchange(
      dashboard_,
      "GET /api/status HTTP/1.1\r\nHost: " + dashboard_ + "\r\n\r\n", kTimeout);
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_FALSE(answer->starts_with("HTTP/")) << *answer;
  EXPECT_EQ(answer->find("\"state\""), std::string::npos) << *answer;
  auto line =
      shard_->WaitForLine("dashboard: TLS handshake with 127.0.0.1:", 3000);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_NE(line->find(" failed: "), std::string::npos) << *line;
  EXPECT_TRUE(line->starts_with("I ")) << "not at info: " << *line;

  auto status = Get("/api/status");
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(status->result_int(), 200);
}

// The limits hold over TLS: a handshake takes no longer than a request may
// (--http-timeout-ms), one address gets no more than
// --http-max-clients-per-address connections (one over it is closed at
// once, without a handshake), and headers are bounded (431).
TEST_F(Https, LimitsHoldOverTls) {
  ASSERT_NO_FATAL_FAILURE(
      StartShard({"--http-timeout-ms", "2000", "--http-header-limit", "1024",
                  "--http-max-clients-per-address", "2",
                  "--dashboard-interval-ms", "200"}));

  // Silent after connecting: closed once the timeout passes, and logged.
  const auto t0 = std::chrono::steady_clock::now();
  auto silent = PlainExchange(dashboard_, "", kTimeout);
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GT(waited, milliseconds(1500));
  EXPECT_LT(waited, milliseconds(4000));
  EXPECT_TRUE(
      shard_->WaitForLine("failed: timed out (--http-timeout-ms)", 3000).ok());
  // Its place is given back as it closes; a moment for that.
  std::this_thread::sleep_for(milliseconds(100));

  // Two WebSockets take this address's places; a third connection is
  // closed at once, while the two keep their updates.
  {
    TlsClient a(dashboard_, Cert("ca.pem"));
    TlsClient b(dashboard_, Cert("ca.pem"));
    for (TlsClient* c : {&a, &b}) {
      ASSERT_TRUE(c->Connect().ok());
      ASSERT_TRUE(c->Upgrade("").ok());
      ASSERT_TRUE(c->Read().ok());
    }
    TlsClient third(dashboard_, Cert("ca.pem"));
    const auto t1 = std::chrono::steady_clock::now();
    EXPECT_FALSE(third.Connect().ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t1, milliseconds(1500));
    EXPECT_TRUE(
        shard_->WaitForLine("(--http-max-clients-per-address)", 3000).ok());
    ASSERT_TRUE(a.Read().ok()) << "a held client lost its updates";
    ASSERT_TRUE(b.Read().ok()) << "a held client lost its updates";
  }

  // Once they left, a request with headers over the limit is answered 431.
  TlsClient client(dashboard_, Cert("ca.pem"));
  ASSERT_TRUE(Eventually([&] { return client.Connect().ok(); }, 3000));
  auto big = client.Fetch("GET", "/api/status",
                          {{"X-Filler", std::string(4000, 'x')}});
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->result_int(), 431) << big->body();
}

// A key that does not belong to the certificate stops tether-server at
// start, with an error that names --tls-key.
TEST_F(Https, AKeyThatDoesNotMatchTheCertificateStopsTheServer) {
  std::string output;
  auto code =
      RunToExit({TETHER_SERVER_BIN, "--shard-id", "0", "--shards", "1",
                 "--workers", "1", "--listen", "127.0.0.1:0", "--http",
                 "127.0.0.1:0", "--tls-cert", Cert("node.pem"), "--tls-key",
                 Cert("other.key"), "--tls-ca", Cert("ca.pem")},
                &output, 10000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_NE(*code, 0) << output;
  EXPECT_NE(output.find("--tls-key"), std::string::npos) << output;
  EXPECT_NE(output.find("other.key"), std::string::npos) << output;
  EXPECT_EQ(output.find("dashboard at"), std::string::npos) << output;
}

}  // namespace
}  // namespace tether::testing
