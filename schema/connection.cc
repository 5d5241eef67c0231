#include "schema/connection.h"

#include <sys/socket.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <thread>

#include "schema/log.h"

namespace tether {
namespace {

bool IsNormalEnding(const boost::system::error_code& ec) {
  // A TLS peer that closes without close_notify: as eof on plain TCP.
  return ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
         ec == asio::error::operation_aborted ||
         ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::not_connected ||
         ec == asio::error::connection_aborted;
}

// Asio's transfer_all asks the socket for at most 64 KiB per system call;
// a frame of megabytes then costs dozens of reads and writes, each a
// system call and often a wake-up. This one asks for everything left (the
// buffers still bound each call), so one call moves as much as the socket
// holds.
size_t TransferAll(const boost::system::error_code& ec, size_t /*n*/) {
  return ec ? 0 : size_t{64} << 20;
}

}  // namespace

Connection::Connection(Stream stream, ConnectionOptions options)
    : options_(options),
      peer_(PeerAddress(stream.socket())),
      stream_(std::move(stream)),
      direct_fd_(stream_.tls() ? -1 : stream_.socket().native_handle()),
      strand_(asio::make_strand(stream_.socket().get_executor())),
      deadline_(strand_) {
  boost::system::error_code ignored;
  stream_.socket().set_option(tcp::no_delay(true), ignored);
}

Connection::~Connection() = default;

void Connection::Start(FrameHandler on_frame, CloseHandler on_close) {
  asio::dispatch(strand_, [self = shared_from_this(),
                           on_frame = std::move(on_frame),
                           on_close = std::move(on_close)]() mutable {
    self->on_frame_ = std::move(on_frame);
    self->on_close_ = std::move(on_close);
    self->started_ = self->last_frame_ = asio::steady_timer::clock_type::now();
    self->OnDeadline();
    self->in_ = std::make_unique<uint8_t[]>(kReadBufferBytes);
    self->DoRead();
  });
}

void Connection::DoRead() {
  // Reads that polled in a row, before the thread's other handlers get
  // their turn.
  constexpr int kMaxPolledReads = 64;
  for (int polled = 0;; ++polled) {
    // Every whole frame in in_, until reading pauses or a body needs
    // more; what their handler sends leaves in one write after the last.
    Cork();
    while (!closed_ && !read_failed_ && incoming_.size() == 0 &&
           queued_bytes_ <= options_.max_queued_bytes) {
      if (!TakeBufferedFrame()) break;
    }
    Uncork();
    if (closed_ || read_failed_) return;
    if (queued_bytes_ > options_.max_queued_bytes) {
      reading_paused_ = true;  // OnWrite resumes once the queue drains
      return;
    }
    if (incoming_.size() > 0) {
      // The rest of a body: straight into its frame.
      return stream_.Visit([this](auto& stream) {
        asio::async_read(
            stream,
            asio::buffer(incoming_.body() + incoming_filled_,
                         incoming_.body_size() - incoming_filled_),
            TransferAll,
            asio::bind_executor(strand_,
                                [self = shared_from_this()](auto ec, size_t n) {
                                  self->OnReadBody(ec, n);
                                }));
      });
    }
    // Less than a header left: to the front, and read more behind it.
    std::memmove(in_.get(), in_.get() + in_begin_, in_end_ - in_begin_);
    in_end_ -= in_begin_;
    in_begin_ = 0;
    if (polled == kMaxPolledReads) {
      // The thread's other handlers (timers, other connections) take their
      // turn -- the reactor is polled, not waited on, while this is queued
      // -- and then this connection polls on. Waiting in the reactor here
      // instead would cost a quick peer a wake-up every kMaxPolledReads
      // requests: more than 1% of them, its p99.
      asio::post(strand_, [self = shared_from_this()] { self->DoRead(); });
      return;
    }
    if (!PollRead()) break;
  }
  if (Polls()) read_armed_ = std::chrono::steady_clock::now();
  stream_.Visit([this](auto& stream) {
    stream.async_read_some(
        asio::buffer(in_.get() + in_end_, kReadBufferBytes - in_end_),
        asio::bind_executor(strand_,
                            [self = shared_from_this()](auto ec, size_t n) {
                              self->OnReadSome(ec, n);
                            }));
  });
}

bool Connection::PollRead() {
  if (!peer_quick_) return false;  // only ever set when Polls()
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::microseconds(options_.spin_us);
  do {
    const ssize_t n = ::recv(direct_fd_, in_.get() + in_end_,
                             kReadBufferBytes - in_end_, MSG_DONTWAIT);
    if (n > 0) {
      bytes_in_ += n;
      in_end_ += n;
      ++polled_reads_;
      return true;
    }
    // The end of the stream, or an error: the reactor's read reports it.
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return false;
    }
  } while (std::chrono::steady_clock::now() < until);
  peer_quick_ = false;
  return false;
}

void Connection::OnReadSome(const boost::system::error_code& ec, size_t n) {
  bytes_in_ += n;
  in_end_ += n;
  if (Polls()) {
    peer_quick_ = std::chrono::steady_clock::now() - read_armed_ <
                  std::chrono::microseconds(options_.spin_us);
  }
  if (ec) {
    const size_t got = in_end_ - in_begin_;
    if (ec == asio::error::eof && got > 0) {
      return FailRead(BadFrame("truncated frame header: got " +
                               std::to_string(got) + " of 4 bytes"));
    }
    return Shutdown(IsNormalEnding(ec) ? Status::Ok()
                                       : Unavailable(ec.message()));
  }
  DoRead();
}

bool Connection::TakeBufferedFrame() {
  const uint8_t* at = in_.get() + in_begin_;
  const size_t held = in_end_ - in_begin_;
  if (held < kFrameHeaderBytes) return false;
  // A TLS record (a handshake, TLS 1.x) where the first frame should be.
  if (first_header_ && !stream_.tls() && at[0] == 0x16 && at[1] == 0x03) {
    FailRead(ProtocolError(
        "the peer opened a TLS handshake, but this end speaks plain TCP "
        "(started without --tls-cert)"));
    return true;
  }
  first_header_ = false;
  auto length = ParseFrameHeader(at, options_.max_frame_bytes);
  if (!length.ok()) {
    FailRead(length.status());
    return true;
  }
  Frame frame(*length);
  const size_t body = std::min<size_t>(*length, held - kFrameHeaderBytes);
  std::memcpy(frame.body(), at + kFrameHeaderBytes, body);
  in_begin_ += kFrameHeaderBytes + body;
  if (body < *length) {
    // Its rest comes straight into it (DoRead).
    incoming_ = std::move(frame);
    incoming_filled_ = body;
    return true;
  }
  Deliver(std::move(frame));
  return true;
}

void Connection::OnReadBody(const boost::system::error_code& ec, size_t n) {
  bytes_in_ += n;
  incoming_filled_ += n;
  if (ec) {
    if (ec == asio::error::eof) {
      return FailRead(
          BadFrame("truncated frame: got " + std::to_string(incoming_filled_) +
                   " of " + std::to_string(incoming_.body_size()) + " bytes"));
    }
    return Shutdown(IsNormalEnding(ec) ? Status::Ok()
                                       : Unavailable(ec.message()));
  }
  Frame frame = std::move(incoming_);
  incoming_ = Frame();
  incoming_filled_ = 0;
  Cork();  // with what follows it in in_ (DoRead uncorks)
  Deliver(std::move(frame));
  DoRead();
}

void Connection::Deliver(Frame frame) {
  if (Status s = frame.Verify(); !s.ok()) return FailRead(s);
  last_frame_ = asio::steady_timer::clock_type::now();
  if (on_frame_) on_frame_(std::move(frame));
}

void Connection::FailRead(const Status& why) {
  read_failed_ = true;
  TETHER_LOG(kWarning) << "closing connection from " << peer_ << ": "
                       << why.message();
  Uncork();  // answers to the frames before the bad one
  // Keep a write in flight alive (asio still owns its buffer), and a frame
  // partly written already: its rest must go before the Error.
  AdoptPartial();
  const bool keep_front = writing_ || front_sent_ > 0;
  while (queue_.size() > (keep_front ? 1u : 0u)) queue_.pop_back();
  queued_bytes_ = queue_.empty() ? 0 : queue_.front()->size();
  queue_.push_back(MakeErrorFrame(0, why));
  queued_bytes_ += queue_.back()->size();
  HandToStrand();
  close_after_write_ = true;
  if (!writing_) DoWrite();
  // Report the failure now; the Error still goes out before the close.
  if (on_close_) {
    auto handler = std::move(on_close_);
    on_close_ = nullptr;
    handler(why);
  }
}

void Connection::Send(OutFrame frame) {
  if (WriteNow(frame)) return;
  asio::dispatch(
      strand_, [self = shared_from_this(), frame = std::move(frame)]() mutable {
        self->Enqueue(std::move(frame), false);
      });
}

void Connection::SendAndClose(OutFrame frame) {
  HandToStrand();
  asio::dispatch(
      strand_, [self = shared_from_this(), frame = std::move(frame)]() mutable {
        self->Enqueue(std::move(frame), true);
      });
}

bool Connection::closed() const {
  MutexLock lock(&write_mu_);
  return write_closed_;
}

void Connection::HandToStrand() {
  MutexLock lock(&write_mu_);
  FlushCorkedLocked();
  ++handed_;
}

void Connection::Cork() {
  if (direct_fd_ >= 0) corker_.store(std::this_thread::get_id());
}

void Connection::Uncork() {
  if (direct_fd_ < 0) return;
  corker_.store(std::thread::id());
  if (!held_) return;
  held_ = false;
  MutexLock lock(&write_mu_);
  FlushCorkedLocked();
}

bool Connection::WriteNow(OutFrame& frame) {
  MutexLock lock(&write_mu_);
  if (direct_fd_ < 0 || handed_ > 0 || write_closed_ ||
      frame->size() > kDirectWriteMaxBytes) {
    FlushCorkedLocked();  // sent before `frame`: written before it
    ++handed_;
    return false;
  }
  corked_bytes_ += frame->size();
  corked_.push_back(std::move(frame));
  // Only the frame handler's own answers wait for Uncork; any other
  // thread's frame goes now, behind what is held.
  const bool mine = corker_.load() == std::this_thread::get_id();
  if (mine && corked_.size() < kMaxCorked &&
      corked_bytes_ <= kDirectWriteMaxBytes) {
    held_ = true;
  } else {
    FlushCorkedLocked();
  }
  return true;
}

void Connection::FlushCorkedLocked() {
  size_t done = 0;  // frames of corked_ written whole
  size_t sent = 0;  // bytes of corked_[done] written
  while (done < corked_.size()) {
    iovec pieces[64];
    size_t count = 0;
    size_t want = 0;
    size_t skip = sent;
    for (size_t i = done; i < corked_.size() && count < std::size(pieces);
         ++i) {
      corked_[i]->ForEachPiece([&](const uint8_t* p, size_t n) {
        if (count == std::size(pieces)) return;
        if (skip >= n) {
          skip -= n;
          return;
        }
        pieces[count++] = {const_cast<uint8_t*>(p + skip), n - skip};
        want += n - skip;
        skip = 0;
      });
    }
    msghdr message{};
    message.msg_iov = pieces;
    message.msg_iovlen = count;
    ssize_t n = -1;
    do {
      n = ::sendmsg(direct_fd_, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    // A full socket, or an error: the strand writes the rest (and reports
    // what fails).
    if (n <= 0) break;
    bytes_out_ += n;
    for (size_t left = n; left > 0;) {
      const size_t rest = corked_[done]->size() - sent;
      if (left < rest) {
        sent += left;
        break;
      }
      left -= rest;
      ++done;
      sent = 0;
    }
    if (static_cast<size_t>(n) < want) break;  // the socket is full
  }
  if (done < corked_.size()) {
    // Nothing was handed to the strand before these (handed_ was 0).
    partial_sent_ = sent;
    for (size_t i = done; i < corked_.size(); ++i) {
      partial_.push_back(std::move(corked_[i]));
      ++handed_;
    }
    asio::post(strand_, [self = shared_from_this()] {
      if (self->closed_) return;
      self->AdoptPartial();
      if (!self->writing_) self->DoWrite();
    });
  }
  corked_.clear();
  corked_bytes_ = 0;
}

void Connection::AdoptPartial() {
  MutexLock lock(&write_mu_);
  if (partial_.empty()) return;
  // Nothing was handed to the strand before them: they go first.
  for (const OutFrame& frame : partial_) queued_bytes_ += frame->size();
  queue_.insert(queue_.begin(), std::make_move_iterator(partial_.begin()),
                std::make_move_iterator(partial_.end()));
  partial_.clear();
  front_sent_ = partial_sent_;
}

void Connection::Enqueue(OutFrame frame, bool close_after) {
  if (closed_ || close_after_write_) return;
  AdoptPartial();
  queued_bytes_ += frame->size();
  queue_.push_back(std::move(frame));
  if (close_after) close_after_write_ = true;
  if (!writing_) DoWrite();
}

void Connection::Close() {
  asio::dispatch(strand_,
                 [self = shared_from_this()] { self->Shutdown(Status::Ok()); });
}

void Connection::DoWrite() {
  if (closed_) return;
  if (queue_.empty()) {
    if (close_after_write_) Shutdown(Status::Ok());
    return;
  }
  writing_ = true;
  // A frame with spliced payloads goes out as one gathered write.
  std::vector<asio::const_buffer> pieces;
  pieces.reserve(2 * queue_.front()->splices().size() + 1);
  size_t skip = front_sent_;  // the part a direct write already sent
  queue_.front()->ForEachPiece([&pieces, &skip](const uint8_t* p, size_t n) {
    if (skip >= n) {
      skip -= n;
      return;
    }
    pieces.emplace_back(p + skip, n - skip);
    skip = 0;
  });
  stream_.Visit([this, &pieces](auto& stream) {
    asio::async_write(stream, pieces, TransferAll,
                      asio::bind_executor(strand_, [self = shared_from_this()](
                                                       auto ec, size_t n) {
                        self->OnWrite(ec, n);
                      }));
  });
}

void Connection::OnWrite(const boost::system::error_code& ec, size_t n) {
  writing_ = false;
  if (ec) {
    return Shutdown(IsNormalEnding(ec) ? Status::Ok()
                                       : Unavailable(ec.message()));
  }
  bytes_out_ += n;
  queued_bytes_ -= queue_.front()->size();
  queue_.pop_front();
  front_sent_ = 0;
  {
    MutexLock lock(&write_mu_);
    --handed_;
  }
  MaybeResumeRead();
  DoWrite();
}

void Connection::MaybeResumeRead() {
  if (reading_paused_ && queued_bytes_ <= options_.max_queued_bytes &&
      !close_after_write_) {
    reading_paused_ = false;
    DoRead();
  }
}

void Connection::ArmDeadline(asio::steady_timer::time_point when) {
  deadline_.expires_at(when);
  deadline_.async_wait(
      [self = shared_from_this()](const boost::system::error_code& ec) {
        if (!ec) self->OnDeadline();
      });
}

void Connection::OnDeadline() {
  if (closed_) return;
  using Clock = asio::steady_timer::clock_type;
  const auto now = Clock::now();
  auto next = Clock::time_point::max();
  const int handshake = options_.handshake_timeout_ms;
  if (!handshake_done_ && handshake > 0) {
    const auto due = started_ + std::chrono::milliseconds(handshake);
    if (due <= now) {
      return Shutdown(
          Status(Code::kTimeout, "handshake not done within " +
                                     std::to_string(handshake) +
                                     " ms (--handshake-timeout-ms)"));
    }
    next = due;
  }
  const int idle = options_.idle_timeout_ms;
  if (idle > 0) {
    const auto due = last_frame_ + std::chrono::milliseconds(idle);
    if (due <= now) {
      return Shutdown(Status(
          Code::kTimeout,
          "no frame for " + std::to_string(idle) + " ms (--idle-timeout-ms)"));
    }
    next = std::min(next, due);
  }
  if (next != Clock::time_point::max()) ArmDeadline(next);
}

void Connection::Shutdown(const Status& why) {
  if (closed_) return;
  closed_ = true;
  {
    // No direct write may touch the socket once it closes; what is corked
    // was sent before the close.
    MutexLock lock(&write_mu_);
    FlushCorkedLocked();
    write_closed_ = true;
    partial_.clear();
  }
  deadline_.cancel();
  boost::system::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
  while (queue_.size() > (writing_ ? 1u : 0u)) queue_.pop_back();
  on_frame_ = nullptr;
  if (on_close_) {
    auto handler = std::move(on_close_);
    on_close_ = nullptr;
    handler(why);
  }
}

std::optional<asio::ip::address> ResolveAddress(const std::string& host) {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (!ec) return address;
  asio::io_context io;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, "0", ec);
  if (ec || results.empty()) return std::nullopt;
  return results.begin()->endpoint().address();
}

Result<HostPort> Listen(tcp::acceptor& acceptor, const std::string& listen,
                        const std::string& flag) {
  TETHER_ASSIGN_OR_RETURN(auto hp, ParseHostPort(listen, flag, true));
  auto address = ResolveAddress(hp.host);
  if (!address) {
    return InvalidArgument(flag + ": cannot resolve '" + hp.host + "'");
  }
  boost::system::error_code ec;
  tcp::endpoint endpoint(*address, hp.port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable(flag + ": cannot listen on " + listen + ": " +
                       ec.message());
  }
  return HostPort{hp.host, acceptor.local_endpoint().port()};
}

Result<Stream> ConnectWithRetry(asio::io_context& io, const HostPort& address,
                                const std::string& what, int timeout_ms,
                                std::shared_ptr<asio::ssl::context> tls) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  tcp::resolver resolver(io);
  std::string last_error;
  while (true) {
    boost::system::error_code ec;
    auto endpoints =
        resolver.resolve(address.host, std::to_string(address.port), ec);
    if (!ec) {
      tcp::socket socket(io);
      asio::connect(socket, endpoints, ec);
      if (!ec) {
        auto stream = TlsConnect(std::move(socket), tls, timeout_ms);
        if (!stream.ok()) {
          return stream.status().WithContext("cannot reach " + what + " at " +
                                             address.ToString());
        }
        return stream;
      }
      last_error = ec.message();
    } else if (ec == asio::error::host_not_found ||
               ec == asio::error::host_not_found_try_again) {
      // A name that does not exist yet (a pod not scheduled) may appear.
      last_error = "the host name '" + address.host + "' does not resolve (" +
                   ec.message() + ")";
    } else {
      last_error = ec.message();
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Unavailable("cannot reach " + what + " at " + address.ToString() +
                     ": " + last_error + " (tried for " +
                     std::to_string(timeout_ms / 1000.0).substr(0, 4) + " s)");
}

}  // namespace tether
