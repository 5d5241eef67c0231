// Test support: a raw TCP peer that speaks bytes and frames to a shard, and
// the frames and checks the hostile-input tests share.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "schema/flags.h"
#include "schema/frame.h"
#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"
#include "worker/client.h"

namespace tether::testing {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// How long a test waits for a shard's answer.
inline constexpr int kReplyTimeoutMs = 3000;

// A TCP peer that speaks raw bytes. Writes block; reads run the socket's own
// io_context for at most a timeout (asio's blocking reads ignore
// SO_RCVTIMEO, so they could hang a test on a shard that never answers).
class RawPeer {
 public:
  static Result<std::unique_ptr<RawPeer>> Connect(const std::string& address) {
    auto hp = ParseHostPort(address, "shard address");
    if (!hp.ok()) return hp.status();
    std::unique_ptr<RawPeer> peer(new RawPeer());
    boost::system::error_code ec;
    tcp::resolver resolver(peer->io_);
    auto endpoints = resolver.resolve(hp->host, std::to_string(hp->port), ec);
    if (!ec) asio::connect(peer->socket_, endpoints, ec);
    if (ec) {
      return Unavailable("cannot connect to " + address + ": " + ec.message());
    }
    return peer;
  }

  // Writes every byte (small writes only: nothing bounds a blocked write).
  boost::system::error_code Send(std::span<const uint8_t> bytes) {
    boost::system::error_code ec;
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), ec);
    return ec;
  }

  void ShutdownSend() {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
  }

  void Close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  // Reads one whole frame (header, then body) and verifies it.
  Result<Frame> ReadFrame(int timeout_ms) {
    uint8_t header[kFrameHeaderBytes];
    if (auto ec = ReadExactly(header, sizeof header, timeout_ms); ec) {
      return Unavailable("reading a frame header: " + ec.message());
    }
    uint32_t n = 0;
    for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
      n |= static_cast<uint32_t>(header[i]) << (8 * i);
    }
    if (n > (1u << 20)) return BadFrame("reply of " + std::to_string(n));
    Frame frame(n);
    if (auto ec = ReadExactly(frame.body(), n, timeout_ms); ec) {
      return Unavailable("reading a frame body: " + ec.message());
    }
    if (Status s = frame.Verify(); !s.ok()) return s;
    return frame;
  }

  // OK once the shard has closed the connection (end of stream or reset);
  // an error when it sends more bytes or stays open past `timeout_ms`.
  Status WaitForClose(int timeout_ms) {
    uint8_t byte;
    auto ec = ReadExactly(&byte, 1, timeout_ms);
    if (!ec) return Internal("shard sent more bytes instead of closing");
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      return Status::Ok();
    }
    return Status(Code::kTimeout, "shard kept the connection: " + ec.message());
  }

 private:
  RawPeer() : socket_(io_) {}

  // Reads exactly `n` bytes, giving up after `timeout_ms` (timed_out).
  boost::system::error_code ReadExactly(void* data, size_t n, int timeout_ms) {
    boost::system::error_code result = asio::error::timed_out;
    bool done = false;
    asio::async_read(socket_, asio::buffer(data, n),
                     [&](const boost::system::error_code& ec, size_t) {
                       result = ec;
                       done = true;
                     });
    io_.restart();
    io_.run_for(std::chrono::milliseconds(timeout_ms));
    if (!done) {
      boost::system::error_code ignored;
      socket_.cancel(ignored);
      io_.restart();
      io_.run();
      return asio::error::timed_out;
    }
    return result;
  }

  asio::io_context io_;
  tcp::socket socket_;
};

std::vector<uint8_t> Bytes(const OutBuffer& buffer);
// An observer's Hello at protocol `version`.
std::vector<uint8_t> HelloFrame(uint32_t version,
                                const std::string& client_name = "raw test");
std::vector<uint8_t> StatsRequestFrame();
// A frame header announcing `n` body bytes.
std::vector<uint8_t> Header(uint32_t n);
// A header announcing `body_size` bytes, then that many seeded random bytes.
// mt19937's output is fixed by the standard, so the bytes are too.
std::vector<uint8_t> GarbageFrame(uint32_t seed, uint32_t body_size);

// Whether `text` contains `part`; the failure message shows both.
::testing::AssertionResult Contains(const std::string& text,
                                    const std::string& part);

struct ErrorReply {
  wire::ErrorCode code = wire::ErrorCode::None;
  std::string message;
};

// Reads the shard's answer to a bad input: it must be an Error frame.
Result<ErrorReply> ReadError(RawPeer& peer);

// Connects to `address`, sends `bytes` (then closes the send side when
// `shutdown_send`), and returns the Error the shard answers with, after
// checking that the shard then closes the connection.
void ExpectRefused(const std::string& address, std::span<const uint8_t> bytes,
                   bool shutdown_send, ErrorReply* reply);

// Defines `name` (64 floats, constant 1), pulls it, pushes a gradient of
// ones and pulls again: SGD with `lr` must leave every value at 1 - lr.
// With a small block size the tensor spans every shard.
void ExpectServing(Client& client, const std::string& name, float lr);

// Every shard of `cluster` still runs.
void ExpectAllRunning(Cluster& cluster);

// Bytes every shard has received (first) and sent (second) so far, as
// `client` reads them (Stats).
std::pair<uint64_t, uint64_t> ShardTraffic(Client& client);

}  // namespace tether::testing
