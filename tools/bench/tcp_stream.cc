// tether-bench-tcp: the raw loopback TCP baseline for tether's benchmarks.
//
//   tether-bench-tcp --serve 127.0.0.1:0        (prints "port N", then
//                                                 receives and discards)
//   tether-bench-tcp --send 127.0.0.1:N --bytes 268435456
//   tether-bench-tcp --echo 127.0.0.1:0 --size 64  (prints "port N", then
//                                                 sends back each message)
//   tether-bench-tcp --ping 127.0.0.1:N --size 64 --ops 20000
//
// The sender writes --bytes in 4 MiB writes to one stream; the receiver
// reads until end of stream. The sender prints "tcp_stream GB/s X" once the
// receiver has acknowledged every byte, so the figure covers delivery, not
// just the send buffer.
//
// Ping-pong, the baseline of the latency benchmark: the pinger writes a
// --size message, waits for it to come back whole, and again, --ops times
// (after 1000 untimed); TCP_NODELAY on both ends, one blocking thread each,
// as a hand-written request/reply loop would be. With --spin-us the pinger
// polls for the reply that long before it blocks (as a tether client's
// blocking call does, ClientOptions::spin_us), and the echo for the next
// message (as tether-server --spin-us does). Prints "tcp_pingpong
// median_us X p99_us Y".
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "schema/flags.h"
#include "tools/bench/percentiles.h"

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Reads message.size() bytes into `message`, polling for them for
// `spin_us` first; false at the end of the stream.
bool ReadWhole(tcp::socket& socket, std::vector<char>& message, int spin_us) {
  size_t got = 0;
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  while (got < message.size() && std::chrono::steady_clock::now() < until) {
    const ssize_t n = ::recv(socket.native_handle(), message.data() + got,
                             message.size() - got, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n > 0) got += n;
  }
  boost::system::error_code ec;
  if (got < message.size()) {
    asio::read(socket, asio::buffer(message.data() + got, message.size() - got),
               ec);
  }
  return !ec;
}

// Sends each `size`-byte message back until the pinger closes.
void Echo(tcp::socket& socket, size_t size, int spin_us) {
  socket.set_option(tcp::no_delay(true));
  std::vector<char> message(size);
  boost::system::error_code ec;
  while (ReadWhole(socket, message, spin_us)) {
    asio::write(socket, asio::buffer(message), ec);
    if (ec) return;
  }
}

void Ping(tcp::socket& socket, size_t size, int ops, int spin_us) {
  socket.set_option(tcp::no_delay(true));
  std::vector<char> message(size, 1);
  constexpr int kWarmup = 1000;
  std::vector<double> us;
  us.reserve(ops);
  for (int i = 0; i < kWarmup + ops; ++i) {
    const auto start = std::chrono::steady_clock::now();
    asio::write(socket, asio::buffer(message));
    if (!ReadWhole(socket, message, spin_us)) {
      throw std::runtime_error("the echo closed the connection");
    }
    const auto end = std::chrono::steady_clock::now();
    if (i >= kWarmup) {
      us.push_back(
          std::chrono::duration<double, std::micro>(end - start).count());
    }
  }
  const tether::bench::Percentiles p = tether::bench::Summarize(us);
  std::printf("tcp_pingpong median_us %.1f p99_us %.1f\n", p.median, p.p99);
}

}  // namespace

int main(int argc, char** argv) {
  std::string serve, send, echo, ping;
  uint64_t bytes = uint64_t{256} << 20;
  uint64_t size = 64;
  int ops = 20000;
  int spin_us = 0;
  tether::FlagParser p("tether-bench-tcp", "raw TCP stream baseline");
  p.AddString("serve", &serve, "HOST:PORT to receive on");
  p.AddString("send", &send, "HOST:PORT to send to");
  p.AddUint64("bytes", &bytes, "bytes to send");
  p.AddString("echo", &echo, "HOST:PORT to echo messages on");
  p.AddString("ping", &ping, "HOST:PORT of an --echo to time round trips to");
  p.AddUint64("size", &size, "ping-pong message size in bytes");
  p.AddInt("ops", &ops, "timed ping-pong round trips");
  p.AddInt("spin-us", &spin_us,
           "how long the pinger polls for a reply, and the echo for the "
           "next message, before it blocks");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  if (size < 1 || size > (uint64_t{1} << 20) || ops < 1) {
    std::cerr << "tether-bench-tcp: --size must be 1 to 1048576 and --ops at "
                 "least 1\n";
    return 2;
  }
  try {
    asio::io_context io;
    if (!echo.empty()) {
      auto hp = tether::ParseHostPort(echo, "--echo", true);
      if (!hp.ok()) throw std::runtime_error(hp.status().message());
      tcp::acceptor acceptor(
          io, tcp::endpoint(asio::ip::make_address(hp->host), hp->port));
      std::cout << "port " << acceptor.local_endpoint().port() << std::endl;
      tcp::socket socket = acceptor.accept();
      Echo(socket, size, spin_us);
      return 0;
    }
    if (!ping.empty()) {
      auto hp = tether::ParseHostPort(ping, "--ping");
      if (!hp.ok()) throw std::runtime_error(hp.status().message());
      tcp::socket socket(io);
      socket.connect(tcp::endpoint(asio::ip::make_address(hp->host), hp->port));
      Ping(socket, size, ops, spin_us);
      return 0;
    }
    std::vector<char> buffer(size_t{4} << 20, 1);
    if (!serve.empty()) {
      auto hp = tether::ParseHostPort(serve, "--serve", true);
      if (!hp.ok()) throw std::runtime_error(hp.status().message());
      tcp::acceptor acceptor(
          io, tcp::endpoint(asio::ip::make_address(hp->host), hp->port));
      std::cout << "port " << acceptor.local_endpoint().port() << std::endl;
      tcp::socket socket = acceptor.accept();
      // Reads until the sender closes; what arrived is not checked here.
      boost::system::error_code ec;
      while (!ec) socket.read_some(asio::buffer(buffer), ec);
      char ack = 1;
      asio::write(socket, asio::buffer(&ack, 1), ec);
      return 0;
    }
    auto hp = tether::ParseHostPort(send, "--send");
    if (!hp.ok()) throw std::runtime_error(hp.status().message());
    tcp::socket socket(io);
    socket.connect(tcp::endpoint(asio::ip::make_address(hp->host), hp->port));
    auto start = std::chrono::steady_clock::now();
    uint64_t sent = 0;
    while (sent < bytes) {
      size_t n = std::min<uint64_t>(buffer.size(), bytes - sent);
      asio::write(socket, asio::buffer(buffer.data(), n));
      sent += n;
    }
    socket.shutdown(tcp::socket::shutdown_send);
    char ack = 0;
    asio::read(socket, asio::buffer(&ack, 1));
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    std::printf("tcp_stream GB/s %.3f\n", sent / secs / 1e9);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tether-bench-tcp: " << e.what() << "\n";
    return 1;
  }
}
