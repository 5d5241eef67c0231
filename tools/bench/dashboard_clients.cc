// tether-bench-dashboard-clients: N WebSocket clients of a dashboard that
// read every update, as N open browser tabs would, until SIGINT/SIGTERM or
// --seconds; then prints how many messages and bytes they received.
// Against a dashboard on an IPv4 loopback address the clients connect from
// different loopback addresses (127.0.1.1, 127.0.1.2, ...; --per-address
// clients each), as tabs on several machines would: the dashboard limits
// the connections from one address (--http-max-clients-per-address).
#include <signal.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "schema/flags.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

namespace {

std::atomic<uint64_t> g_messages{0}, g_bytes{0};
std::atomic<uint64_t> g_failed{0};  // could not connect
std::atomic<uint64_t> g_closed{0};  // closed by the server (it stopped)

class Reader : public std::enable_shared_from_this<Reader> {
 public:
  // `source`: the address to connect from; unspecified: any.
  Reader(asio::io_context& io, tcp::endpoint endpoint, std::string host,
         asio::ip::address source)
      : ws_(io),
        endpoint_(std::move(endpoint)),
        host_(std::move(host)),
        source_(std::move(source)) {}
  void Start() {
    if (!source_.is_unspecified()) {
      tcp::socket& socket = beast::get_lowest_layer(ws_).socket();
      beast::error_code ec;
      socket.open(endpoint_.protocol(), ec);
      if (!ec) socket.bind(tcp::endpoint(source_, 0), ec);
      if (ec) return Fail(ec);
    }
    beast::get_lowest_layer(ws_).async_connect(
        endpoint_, [self = shared_from_this()](beast::error_code ec) {
          if (ec) return self->Fail(ec);
          self->ws_.async_handshake(self->host_, "/ws",
                                    [self](beast::error_code ec) {
                                      if (ec) return self->Fail(ec);
                                      self->connected_ = true;
                                      self->Read();
                                    });
        });
  }
  void Close() {
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().close(ignored);
  }

 private:
  void Read() {
    ws_.async_read(buffer_,
                   [self = shared_from_this()](beast::error_code ec, size_t n) {
                     if (ec) return self->Fail(ec);
                     ++g_messages;
                     g_bytes += n;
                     self->buffer_.consume(n);
                     self->Read();
                   });
  }
  void Fail(beast::error_code ec) {
    if (ec == asio::error::operation_aborted ||
        ec == asio::error::bad_descriptor) {
      return;  // we closed it
    }
    if (connected_) {
      ++g_closed;
      return;
    }
    ++g_failed;
    std::fprintf(stderr, "dashboard client: %s\n", ec.message().c_str());
  }
  bool connected_ = false;
  websocket::stream<beast::tcp_stream> ws_;
  tcp::endpoint endpoint_;
  std::string host_;
  asio::ip::address source_;
  beast::flat_buffer buffer_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  int clients = 50;
  int per_address = 8;
  double seconds = 0;
  tether::FlagParser p(
      "tether-bench-dashboard-clients",
      "WebSocket clients reading a tether dashboard's updates.");
  p.AddString("address", &address, "HOST:PORT of the dashboard");
  p.AddInt("clients", &clients, "how many clients");
  p.AddInt("per-address", &per_address,
           "clients from each loopback address (a loopback dashboard); 0: "
           "all from one");
  p.AddDouble("seconds", &seconds,
              "stop after this long; 0: at SIGINT/SIGTERM");
  if (auto code = p.ParseForMain(argc, argv)) return *code;
  auto hp = tether::ParseHostPort(address, "--address");
  if (!hp.ok()) {
    std::cerr << "tether-bench-dashboard-clients: " << hp.status().message()
              << "\n";
    return 2;
  }
  asio::io_context io(1);
  tcp::endpoint endpoint(asio::ip::make_address(hp->host), hp->port);
  std::vector<std::shared_ptr<Reader>> readers;
  const bool spread = per_address > 0 && endpoint.address().is_v4() &&
                      endpoint.address().is_loopback();
  for (int i = 0; i < clients; ++i) {
    asio::ip::address source;  // unspecified: any
    if (spread) {
      const int n = i / per_address;  // 127.0.1.1, 127.0.1.2, ...
      source = asio::ip::address_v4((127u << 24) | ((1u + n / 250) << 8) |
                                    (n % 250 + 1));
    }
    readers.push_back(std::make_shared<Reader>(io, endpoint, address, source));
    readers.back()->Start();
  }
  auto start = std::chrono::steady_clock::now();
  auto stop = [&] {
    for (auto& r : readers) r->Close();
  };
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](beast::error_code, int) { stop(); });
  asio::steady_timer timer(io);
  if (seconds > 0) {
    timer.expires_after(std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(seconds)));
    timer.async_wait([&](beast::error_code ec) {
      if (!ec) {
        stop();
        signals.cancel();
      }
    });
  }
  io.run();
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf(
      "dashboard clients: %d clients received %llu messages (%.0f/s, %.1f "
      "MB/s) in %.1f s; %llu could not connect, %llu closed by the server\n",
      clients, static_cast<unsigned long long>(g_messages.load()),
      g_messages / secs, g_bytes / secs / 1e6, secs,
      static_cast<unsigned long long>(g_failed.load()),
      static_cast<unsigned long long>(g_closed.load()));
  return g_failed > 0 ? 1 : 0;
}
