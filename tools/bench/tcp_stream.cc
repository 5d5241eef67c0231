// tether-bench-tcp: the raw loopback TCP baseline for tether's benchmarks.
//
//   tether-bench-tcp --serve 127.0.0.1:0        (prints "port N", then
//                                                 receives and discards)
//   tether-bench-tcp --send 127.0.0.1:N --bytes 268435456
//
// The sender writes --bytes in 4 MiB writes to one stream; the receiver
// reads until end of stream. The sender prints "tcp_stream GB/s X" once the
// receiver has acknowledged every byte, so the figure covers delivery, not
// just the send buffer.
#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "schema/flags.h"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

int main(int argc, char** argv) {
  std::string serve, send;
  uint64_t bytes = uint64_t{256} << 20;
  tether::FlagParser p("tether-bench-tcp", "raw TCP stream baseline");
  p.AddString("serve", &serve, "HOST:PORT to receive on");
  p.AddString("send", &send, "HOST:PORT to send to");
  p.AddUint64("bytes", &bytes, "bytes to send");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  try {
    asio::io_context io;
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
