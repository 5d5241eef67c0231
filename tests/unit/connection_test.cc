// Connection's writes over real loopback TCP: frames sent from several
// threads at once -- small ones written straight from the sending thread,
// large ones by the strand -- arrive whole and, per thread, in order; and a
// peer that stops reading until the socket is full still gets every byte
// in order once it reads; and frames cut anywhere by the peer's writes
// (one byte at a time, many in one write, one larger than the read
// buffer) are each delivered whole, in order; and answers sent while one
// read's frames are handled go out together, in order; and a connection
// that polls for a quick peer's requests answers them in order without
// keeping its thread from other work.
#include "schema/connection.h"

#include <gtest/gtest.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "schema/io_pool.h"
#include "schema/mutex.h"
#include "schema/status.h"

namespace tether {
namespace {

constexpr uint64_t kPerThread = uint64_t{1} << 20;  // id = thread * this + seq

// A frame whose request id is `id`, about `bytes` long.
OutFrame NumberedFrame(uint64_t id, size_t bytes) {
  return MakeErrorFrame(id, Status(Code::kInternal, std::string(bytes, 'x')));
}

// How long frame `seq` of a thread is: mostly small (direct writes), every
// seventh larger than a direct write may be.
size_t SizeOf(uint64_t seq) {
  return seq % 7 == 6 ? Connection::kDirectWriteMaxBytes + 1000
                      : 40 + seq % 300;
}

// The next frame on `socket`, read whole, or why its header is bad.
Result<Frame> ReadFrame(tcp::socket& socket) {
  uint8_t header[kFrameHeaderBytes];
  asio::read(socket, asio::buffer(header));
  auto length = ParseFrameHeader(header, kDefaultMaxFrameBytes);
  if (!length.ok()) return length.status();
  Frame frame(*length);
  asio::read(socket, asio::buffer(frame.body(), frame.body_size()));
  return frame;
}

// A connected pair of sockets on loopback, on `io`.
std::pair<tcp::socket, tcp::socket> Pair(asio::io_context& io) {
  tcp::acceptor acceptor(io,
                         tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  tcp::socket server = acceptor.accept();
  return {std::move(client), std::move(server)};
}

TEST(Connection, FramesFromManyThreadsArriveWholeAndInOrderPerThread) {
  IoPool pool(2);
  auto [a, b] = Pair(pool.Next());
  auto sender = std::make_shared<Connection>(std::move(a), ConnectionOptions{});
  auto receiver =
      std::make_shared<Connection>(std::move(b), ConnectionOptions{});
  constexpr int kThreads = 4;
  constexpr uint64_t kFrames = 1500;
  Mutex mu;
  std::vector<uint64_t> next(kThreads, 0);  // the seq expected from each
  uint64_t received = 0;
  std::string error;
  receiver->Start(
      [&](Frame frame) {
        const wire::Error* e = frame.message()->body_as_Error();
        MutexLock lock(&mu);
        if (e == nullptr || e->message() == nullptr) {
          error = "a frame that is not an Error";
          return;
        }
        const uint64_t id = e->request_id();
        const uint64_t thread = id / kPerThread;
        const uint64_t seq = id % kPerThread;
        if (thread >= kThreads || seq != next[thread] ||
            e->message()->size() != SizeOf(seq)) {
          if (error.empty()) {
            error = "thread " + std::to_string(thread) + ": got frame " +
                    std::to_string(seq) + " of " +
                    std::to_string(e->message()->size()) + " bytes, expected " +
                    std::to_string(next[thread % kThreads]);
          }
        }
        next[thread % kThreads] = seq + 1;
        ++received;
      },
      [](const Status&) {});
  sender->Start([](Frame) {}, [](const Status&) {});
  pool.Start();

  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t seq = 0; seq < kFrames; ++seq) {
        sender->Send(NumberedFrame(t * kPerThread + seq, SizeOf(seq)));
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    {
      MutexLock lock(&mu);
      if (received == kThreads * kFrames || !error.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    MutexLock lock(&mu);
    EXPECT_EQ(error, "");
    EXPECT_EQ(received, kThreads * kFrames);
  }
  sender->Close();
  receiver->Close();
  pool.Release();
  pool.Join();
}

// The socket fills while the peer does not read: direct writes that the
// socket takes only in part must be finished by the strand before any
// frame sent after them.
TEST(Connection, PeerThatReadsLateGetsEveryFrameInOrder) {
  IoPool pool(1);
  auto [a, b] = Pair(pool.Next());
  auto sender = std::make_shared<Connection>(std::move(a), ConnectionOptions{});
  sender->Start([](Frame) {}, [](const Status&) {});
  pool.Start();
  constexpr uint64_t kFrames =
      1200;  // about 30 MiB: more than the socket holds
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t seq = 0; seq < kFrames; ++seq) {
        // Just under the direct-write limit, so most go out directly.
        sender->Send(
            NumberedFrame(t * kPerThread + seq,
                          Connection::kDirectWriteMaxBytes - 200 - seq % 1000));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(sender->bytes_out(), 2 * kFrames * Connection::kDirectWriteMaxBytes)
      << "the socket took everything: the late reader tested nothing";

  std::vector<uint64_t> next(2, 0);
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < 2 * kFrames; ++i) {
    Result<Frame> frame = ReadFrame(b);
    ASSERT_TRUE(frame.ok())
        << "frame " << i << ": " << frame.status().message();
    ASSERT_TRUE(frame->Verify().ok()) << "frame " << i;
    const wire::Error* e = frame->message()->body_as_Error();
    ASSERT_NE(e, nullptr);
    const uint64_t thread = e->request_id() / kPerThread;
    const uint64_t seq = e->request_id() % kPerThread;
    ASSERT_LT(thread, 2u);
    ASSERT_EQ(seq, next[thread]) << "thread " << thread;
    ASSERT_EQ(e->message()->size(),
              Connection::kDirectWriteMaxBytes - 200 - seq % 1000);
    next[thread] = seq + 1;
    bytes += frame->size();
  }
  // Every byte read was counted as written, once.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sender->bytes_out() < bytes &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(sender->bytes_out(), bytes);
  sender->Close();
  pool.Release();
  pool.Join();
}

// The peer writes a stream of frames cut at awkward places: the first
// ones a byte at a time (a header split over reads), then many in one
// write, then frames larger than the connection's read buffer cut at odd
// offsets. Each is delivered whole, once, in order, and every byte is
// counted as read.
TEST(Connection, FramesCutAnywhereByThePeerArriveWholeAndInOrder) {
  IoPool pool(1);
  auto [a, b] = Pair(pool.Next());
  auto receiver =
      std::make_shared<Connection>(std::move(b), ConnectionOptions{});
  Mutex mu;
  std::vector<std::pair<uint64_t, size_t>> got;  // request id, message size
  uint64_t bytes_in = 0;  // as the connection counted them, on its strand
  Connection* r = receiver.get();
  receiver->Start(
      [&](Frame frame) {
        const wire::Error* e = frame.message()->body_as_Error();
        MutexLock lock(&mu);
        got.emplace_back(e ? e->request_id() : 0,
                         e && e->message() ? e->message()->size() : 0);
        bytes_in = r->bytes_in();
      },
      [](const Status&) {});
  pool.Start();

  // Frame i: an Error with request id i + 1; sizes from a few bytes to
  // twice the connection's read buffer.
  constexpr uint64_t kFrames = 60;
  auto size_of = [](uint64_t i) -> size_t {
    return i % 10 == 9 ? (size_t{128} << 10) + i : 10 + i * 7;
  };
  std::string stream;
  for (uint64_t i = 0; i < kFrames; ++i) {
    NumberedFrame(i + 1, size_of(i))
        ->ForEachPiece([&](const uint8_t* p, size_t n) {
          stream.append(reinterpret_cast<const char*>(p), n);
        });
  }
  // Cuts: 1 byte at a time for the first 200 bytes, then pieces of
  // 4000, 3, 70001, 5, ... bytes.
  size_t at = 0;
  const size_t pieces[] = {4000, 3, 70001, 5, 33333, 1, 2};
  for (size_t i = 0; at < stream.size(); ++i) {
    const size_t n =
        std::min(stream.size() - at, at < 200 ? size_t{1} : pieces[i % 7]);
    asio::write(a, asio::buffer(stream.data() + at, n));
    at += n;
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    {
      MutexLock lock(&mu);
      if (got.size() >= kFrames) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    MutexLock lock(&mu);
    ASSERT_EQ(got.size(), kFrames);
    for (uint64_t i = 0; i < kFrames; ++i) {
      EXPECT_EQ(got[i].first, i + 1) << "frame " << i;
      EXPECT_EQ(got[i].second, size_of(i)) << "frame " << i;
    }
    EXPECT_EQ(bytes_in, stream.size());
  }
  receiver->Close();
  pool.Release();
  pool.Join();
}

// Bytes waiting to be read on `socket`.
int Readable(tcp::socket& socket) {
  int n = -1;
  ::ioctl(socket.native_handle(), FIONREAD, &n);
  return n;
}

// Twenty requests reach the connection in one read. What the frame
// handler sends while it handles them is held and written together once
// it is done with the last (the peer sees none of it before); a frame
// another thread sends meanwhile goes out at once, behind what is held;
// a frame too large to be held goes behind them too; every frame arrives
// whole and in the order sent.
TEST(Connection, AnswersSentWhileAReadIsHandledGoOutInOrder) {
  IoPool pool(1);
  auto [a, b] = Pair(pool.Next());
  auto conn = std::make_shared<Connection>(std::move(b), ConnectionOptions{});
  tcp::socket& peer = a;  // a lambda cannot capture a structured binding
  constexpr uint64_t kRequests = 20;
  constexpr uint64_t kOther = 1000;  // the other thread's frame
  constexpr uint64_t kLarge = 2000;  // too large to be held
  std::string requests;
  for (uint64_t i = 0; i < kRequests; ++i) {
    NumberedFrame(i, 30)->ForEachPiece([&](const uint8_t* p, size_t n) {
      requests.append(reinterpret_cast<const char*>(p), n);
    });
  }
  // All of them are in the socket before the connection reads.
  asio::write(a, asio::buffer(requests));
  auto reply = [](uint64_t id) {
    return NumberedFrame(
        id, id == kLarge ? Connection::kDirectWriteMaxBytes + 100 : 50 + id);
  };
  std::vector<int> readable(kRequests, -1);  // at the end of each handler
  uint64_t bytes_in_first = 0;
  std::atomic<uint64_t> handled{0};
  Connection* c = conn.get();
  conn->Start(
      [&](Frame frame) {
        const uint64_t i = frame.message()->body_as_Error()->request_id();
        if (i == 0) bytes_in_first = c->bytes_in();
        c->Send(reply(i));
        if (i == 3) std::thread([&] { c->Send(reply(kOther)); }).join();
        if (i == 10) c->Send(reply(kLarge));
        readable[i] = Readable(peer);
        handled.fetch_add(1);
      },
      [](const Status&) {});
  pool.Start();
  // Nothing is read before the last request has been handled.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (handled.load() < kRequests &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(handled.load(), kRequests);

  std::vector<uint64_t> expected;
  for (uint64_t i = 0; i < kRequests; ++i) {
    expected.push_back(i);
    if (i == 3) expected.push_back(kOther);
    if (i == 10) expected.push_back(kLarge);
  }
  for (size_t k = 0; k < expected.size(); ++k) {
    Result<Frame> frame = ReadFrame(a);
    ASSERT_TRUE(frame.ok())
        << "reply " << k << ": " << frame.status().message();
    ASSERT_TRUE(frame->Verify().ok()) << "reply " << k;
    const wire::Error* e = frame->message()->body_as_Error();
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(e->request_id(), expected[k]) << "reply " << k;
    EXPECT_EQ(frame->size(), reply(expected[k])->size()) << "reply " << k;
  }
  ASSERT_EQ(bytes_in_first, requests.size())
      << "the requests came in more than one read: nothing was tested";
  auto bytes = [&](const std::vector<uint64_t>& ids) {
    int n = 0;
    for (uint64_t id : ids) n += static_cast<int>(reply(id)->size());
    return n;
  };
  // Held: nothing on the wire while 0..2 are handled.
  EXPECT_EQ(readable[2], 0);
  // The other thread's frame went out at once, behind 0..3.
  EXPECT_EQ(readable[3], bytes({0, 1, 2, 3, kOther}));
  // 4..9 held again.
  EXPECT_EQ(readable[9], readable[3]);
  conn->Close();
  pool.Release();
  pool.Join();
}

// A connection that polls for a quick peer's next request (spin_us), on
// the pool's one thread, answers a request/reply peer: each request, some
// cut in two with a pause between the halves, is answered in order, and
// every read after the first comes by polling, not through the reactor,
// even past the cap on polled reads in a row. The peer never pauses, yet
// a timer on the same thread still fires while it runs (at the cap the
// thread's other handlers get their turn), and the peer's close, seen
// while polling, ends the connection normally.
TEST(Connection, PollingForAQuickPeerAnswersInOrderAndLeavesTheThreadToOthers) {
  IoPool pool(1);
  auto [a, b] = Pair(pool.Next());
  ConnectionOptions options;
  // Longer than any pause of this peer, even under a sanitizer: every read
  // but the first is the poll's.
  options.spin_us = 1000000;
  auto conn = std::make_shared<Connection>(std::move(b), options);
  a.set_option(tcp::no_delay(true));  // the cut requests' halves at once
  constexpr uint64_t kRequests = 3000;
  std::atomic<uint64_t> handled{0};
  std::atomic<uint64_t> polled{0};
  std::atomic<bool> closed{false};
  Status close_status(Code::kInternal, "not closed");
  Connection* c = conn.get();
  conn->Start(
      [&](Frame frame) {
        const uint64_t id = frame.message()->body_as_Error()->request_id();
        c->Send(NumberedFrame(id, 20));
        polled.store(c->polled_reads());
        handled.fetch_add(1);
      },
      [&](const Status& why) {
        close_status = why;
        closed.store(true);
      });
  // Fires once the peer is well under way; notes how far it was.
  std::atomic<uint64_t> handled_when_fired{0};
  asio::steady_timer timer(pool.main(), std::chrono::milliseconds(20));
  timer.async_wait([&](const boost::system::error_code&) {
    handled_when_fired.store(handled.load() + 1);
  });
  pool.Start();

  for (uint64_t i = 0; i < kRequests; ++i) {
    std::string request;
    NumberedFrame(i, 30)->ForEachPiece([&](const uint8_t* p, size_t n) {
      request.append(reinterpret_cast<const char*>(p), n);
    });
    if (i % 100 == 7) {
      // Cut inside the header: the connection polls again for the rest.
      asio::write(a, asio::buffer(request.data(), 2));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      asio::write(a, asio::buffer(request.data() + 2, request.size() - 2));
    } else {
      asio::write(a, asio::buffer(request));
    }
    Result<Frame> frame = ReadFrame(a);
    ASSERT_TRUE(frame.ok())
        << "reply " << i << ": " << frame.status().message();
    ASSERT_TRUE(frame->Verify().ok()) << "reply " << i;
    ASSERT_EQ(frame->message()->body_as_Error()->request_id(), i);
  }
  EXPECT_EQ(handled.load(), kRequests);
  // kRequests + 30 (the cut ones' halves) - 1 reads polled. A connection
  // that waited in the reactor each time its polled reads reached the cap
  // (kMaxPolledReads, 64) would have about 47 fewer.
  EXPECT_GE(polled.load(), kRequests);
  EXPECT_GT(handled_when_fired.load(), 0u) << "the timer never fired";
  EXPECT_LT(handled_when_fired.load(), kRequests)
      << "the timer waited for the peer to finish";

  a.shutdown(tcp::socket::shutdown_both);
  a.close();
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!closed.load() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(closed.load());
  EXPECT_TRUE(close_status.ok()) << close_status.ToString();
  pool.Release();
  pool.Join();
}

}  // namespace
}  // namespace tether
