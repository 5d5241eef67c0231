// A framed, asynchronous TCP connection used by shards and clients alike,
// over plain TCP or TLS (schema/stream.h).
//
// Reads one frame at a time, checks its length against the limit before
// allocating, verifies it, and hands it to the owner's frame handler on the
// connection's strand. Writes are queued (one in flight) and may be issued
// from any thread. While more than `max_queued_bytes` wait to be written,
// reading pauses, so a peer that does not read its replies cannot grow our
// memory. A bad frame makes the connection send an Error saying why (when
// the stream still allows) and close.
//
// Over plain TCP, a small frame sent while nothing else waits to be written
// goes straight to the socket from the calling thread (a non-blocking
// send): a blocking client call then costs no hand-off to an I/O thread.
// What the socket does not take at once is written by the strand, before
// anything sent later; frames from one thread keep their order.
//
// Thread-safe: Send, SendAndClose and Close may be called from any thread.
// Handlers run on the strand, one at a time. Owned by shared_ptr; it stays
// alive while an operation is pending.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "schema/flags.h"
#include "schema/frame.h"
#include "schema/mutex.h"
#include "schema/status.h"
#include "schema/stream.h"

namespace tether {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct ConnectionOptions {
  // Frames longer than this are refused before any allocation.
  size_t max_frame_bytes = kDefaultMaxFrameBytes;
  // Reading pauses while this many bytes wait to be written.
  size_t max_queued_bytes = size_t{256} << 20;
  // The connection closes when HandshakeDone() has not been called this
  // long after Start (a peer that never finishes its Hello), or when no
  // frame has arrived for idle_timeout_ms. 0: no limit.
  int handshake_timeout_ms = 0;
  int idle_timeout_ms = 0;
  // Once a read's frames are handed on, the connection polls its socket
  // this long for the next frame before it waits in the reactor, so that
  // a request/reply peer's next request costs no wake-up. It polls only
  // while the peer is quick (its last frame came within this time of the
  // wait for it starting), so a peer that computes between requests costs
  // one poll per pause. Plain TCP only. 0: never.
  int spin_us = 0;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Called on the strand with each verified frame.
  using FrameHandler = std::function<void(Frame frame)>;
  // Called once on the strand when the connection ends: OK for an orderly
  // close by either side, otherwise the reason.
  using CloseHandler = std::function<void(const Status& why)>;

  // `stream` must be connected (its TLS handshake done) and use an
  // executor of an io_context.
  Connection(Stream stream, ConnectionOptions options);
  ~Connection();

  // Starts reading. Call once.
  void Start(FrameHandler on_frame, CloseHandler on_close);

  // Queues `frame` for sending. Dropped silently once closed. While the
  // frames of one read are handed to the frame handler, the frames it
  // sends are held and leave together in one write when it is done with
  // the last of them: answers to requests that came in one read go out in
  // one system call.
  void Send(OutFrame frame);
  // Queues `frame` and closes once it is written (or on error).
  void SendAndClose(OutFrame frame);
  // Closes now, dropping queued writes. Idempotent.
  void Close();
  // Whether it has closed (either end, or an error). Any thread.
  bool closed() const TETHER_EXCLUDES(write_mu_);

  // The peer finished its handshake: handshake_timeout_ms no longer
  // applies. Call on the strand (from the frame handler).
  void HandshakeDone() { handshake_done_ = true; }

  // "HOST:PORT" of the peer, fixed at construction.
  const std::string& peer() const { return peer_; }
  uint64_t bytes_in() const { return bytes_in_; }
  // Reads that polling (spin_us) brought, not the reactor. On the strand.
  uint64_t polled_reads() const { return polled_reads_; }
  uint64_t bytes_out() const { return bytes_out_.load(); }

  // Frames up to this size may be written from the calling thread.
  static constexpr size_t kDirectWriteMaxBytes = size_t{64} << 10;
  // Held (corked) frames are written at once when there are this many, or
  // more than kDirectWriteMaxBytes of them.
  static constexpr size_t kMaxCorked = 32;

 private:
  // Reading: the socket is read in chunks of up to kReadBufferBytes into
  // in_ (one system call can bring a frame's header and body, or several
  // small frames); a frame's body that does not fit what is there is read
  // straight into its Frame.
  static constexpr size_t kReadBufferBytes = size_t{64} << 10;
  // Delivers the whole frames in in_ (until reading pauses or a frame
  // needs more of its body), then starts the one next read: the rest of
  // that body straight into its frame, or more into in_ -- polled for
  // while the peer is quick (PollRead; after 64 polled reads in a row, the
  // next poll is queued behind the thread's other handlers), else through
  // the reactor.
  void DoRead();
  // Whether this connection polls (options_.spin_us, plain TCP).
  bool Polls() const { return options_.spin_us > 0 && direct_fd_ >= 0; }
  // Polls the socket for more of in_ while the peer is quick; true when
  // bytes came.
  bool PollRead();
  void OnReadSome(const boost::system::error_code& ec, size_t n);
  void OnReadBody(const boost::system::error_code& ec, size_t n);
  // Takes one frame out of in_: true when it did (and delivered it, or
  // kept it in incoming_ to read the rest of its body) or failed the
  // connection; false when in_ holds no whole header.
  bool TakeBufferedFrame();
  // Checks a whole frame and hands it to on_frame_ (FailRead if it is bad).
  void Deliver(Frame frame);
  // Writes `frame` from this thread when it may (plain TCP, small, nothing
  // else waiting) and returns true once the socket took it, or the rest of
  // it is handed to the strand; false: the caller hands it to the strand.
  bool WriteNow(OutFrame& frame) TETHER_EXCLUDES(write_mu_);
  // Counts one more frame handed to the strand (see handed_), after
  // writing what is corked: that was sent first.
  void HandToStrand() TETHER_EXCLUDES(write_mu_);
  // Holds this thread's direct writes in corked_ from now (plain TCP
  // only) ...
  void Cork() TETHER_EXCLUDES(write_mu_);
  // ... until this writes them.
  void Uncork() TETHER_EXCLUDES(write_mu_);
  // Writes corked_ with as few system calls as the socket allows; what it
  // does not take goes to partial_, for the strand to write first.
  void FlushCorkedLocked() TETHER_REQUIRES(write_mu_);
  // On the strand: queues `frame` (after the rest of a direct write).
  void Enqueue(OutFrame frame, bool close_after);
  void AdoptPartial() TETHER_EXCLUDES(write_mu_);
  void DoWrite();
  void OnWrite(const boost::system::error_code& ec, size_t n);
  // Sends an Error for `why` (if the socket still writes), then closes.
  void FailRead(const Status& why);
  void Shutdown(const Status& why);
  void MaybeResumeRead();
  // The handshake and idle limits: one timer, armed at Start and again
  // when it fires early (frames only note their time; no timer work per
  // frame).
  void ArmDeadline(asio::steady_timer::time_point when);
  void OnDeadline();

  // Constant after construction.
  const ConnectionOptions options_;
  const std::string peer_;
  Stream stream_;
  const int direct_fd_;  // the socket for direct writes; -1: TLS, none
  asio::strand<asio::any_io_executor> strand_;
  asio::steady_timer deadline_;                // on the strand
  asio::steady_timer::time_point started_;     // on the strand
  asio::steady_timer::time_point last_frame_;  // on the strand
  bool handshake_done_ = false;                // on the strand

  // Touched on the strand only.
  FrameHandler on_frame_;
  CloseHandler on_close_;
  std::unique_ptr<uint8_t[]> in_;  // kReadBufferBytes, from Start
  size_t in_begin_ = 0;            // in_[in_begin_, in_end_) is unread
  size_t in_end_ = 0;
  bool first_header_ = true;
  bool read_failed_ = false;  // FailRead ran: nothing more is read
  // The poll (options_.spin_us): whether the peer's last frame came
  // quickly, and when the reactor's wait for it began.
  bool peer_quick_ = false;
  std::chrono::steady_clock::time_point read_armed_;
  // A frame whose body is being read straight into it, and how much of
  // the body is in already.
  Frame incoming_;
  size_t incoming_filled_ = 0;
  std::deque<OutFrame> queue_;
  size_t front_sent_ = 0;  // bytes of queue_.front() already written
  size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool reading_paused_ = false;
  bool close_after_write_ = false;
  bool closed_ = false;
  uint64_t bytes_in_ = 0;
  uint64_t polled_reads_ = 0;
  std::atomic<uint64_t> bytes_out_{0};

  // Direct writes. A frame may go straight to the socket only while
  // `handed_` is 0: every frame handed to the strand (posted, queued or
  // being written) is counted until it is written, so nothing sent earlier
  // is still on its way.
  mutable Mutex write_mu_;
  size_t handed_ TETHER_GUARDED_BY(write_mu_) = 0;
  bool write_closed_ TETHER_GUARDED_BY(write_mu_) = false;
  // Direct writes held while a read's frames are handled (see Send), by
  // the thread that handles them (none: not corked). Set and cleared by
  // that thread without the lock: no other thread's id ever compares
  // equal, whenever it looks.
  std::atomic<std::thread::id> corker_;
  bool held_ = false;  // on the strand: the corker held a frame
  std::vector<OutFrame> corked_ TETHER_GUARDED_BY(write_mu_);
  size_t corked_bytes_ TETHER_GUARDED_BY(write_mu_) = 0;
  // Direct writes the socket took only part of (partial_sent_ bytes of
  // the first; none of the others); the strand writes them before
  // anything else.
  std::deque<OutFrame> partial_ TETHER_GUARDED_BY(write_mu_);
  size_t partial_sent_ TETHER_GUARDED_BY(write_mu_) = 0;
};

// The address `host` names: an address literal, or a name's first
// resolved address (the one Listen binds); nullopt when it does not
// resolve.
std::optional<asio::ip::address> ResolveAddress(const std::string& host);

// Opens, binds and listens `acceptor` on `listen` ("HOST:PORT"; port 0
// picks a free one) and returns the address bound, with the real port.
// Errors name `flag`: kInvalidArgument for an address that does not parse
// or resolve, kUnavailable when it cannot be bound (a port in use).
Result<HostPort> Listen(tcp::acceptor& acceptor, const std::string& listen,
                        const std::string& flag);

// Resolves and connects to `address`, retrying refused connections and
// host names that do not resolve yet (a Kubernetes pod's DNS name appears
// once the pod is scheduled) until `timeout_ms` has passed; then, with
// `tls`, runs the client's TLS handshake (the io_context must then be run
// by other threads). Blocking; returns kUnavailable naming `what`, the
// address and the last reason when it cannot connect.
Result<Stream> ConnectWithRetry(
    asio::io_context& io, const HostPort& address, const std::string& what,
    int timeout_ms, std::shared_ptr<asio::ssl::context> tls = nullptr);

}  // namespace tether
