#include "server/http.h"

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <map>
#include <optional>
#include <type_traits>
#include <vector>

#include "schema/connection.h"
#include "schema/flags.h"
#include "schema/log.h"
#include "schema/mutex.h"
#include "schema/tls.h"

namespace tether {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

namespace {

// Whom the per-address cap counts as one client: an IPv4 address, or an
// IPv6 /64 (what one host is usually given, so a host cannot spread its
// connections over its own addresses).
asio::ip::address ClientOf(const asio::ip::address& address) {
  if (!address.is_v6() || address.to_v6().is_v4_mapped()) return address;
  asio::ip::address_v6::bytes_type bytes = address.to_v6().to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);
  return asio::ip::address_v6(bytes);
}

class Places;

// One connection's hold on a place under the caps, given back when the
// session that holds it ends.
class Slot {
 public:
  Slot(Places* places, asio::ip::address client)
      : places_(places), client_(std::move(client)) {}
  ~Slot();
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

 private:
  Places* const places_;
  const asio::ip::address client_;
};

// The connections open at once, in all (--http-max-clients) and from each
// client (--http-max-clients-per-address), so that one client address
// cannot take every place. Thread-safe: places are taken on the acceptor's
// strand and given back on the sessions'.
class Places {
 public:
  explicit Places(const HttpOptions& options)
      : max_total_(options.max_clients),
        max_per_client_(options.max_clients_per_address) {}

  // A place for a connection from `address`; null, with the 503's text in
  // *refusal, when that would go over a cap. A refused connection holds no
  // place: it is answered and closed at once. The first refusal of a
  // client (or of anyone, for the global cap) is logged; the next only
  // once it has fallen back under the cap.
  std::unique_ptr<Slot> Take(const asio::ip::address& address,
                             std::string* refusal) TETHER_EXCLUDES(mu_) {
    const asio::ip::address client = ClientOf(address);
    MutexLock lock(&mu_);
    if (total_ >= max_total_) {
      if (!warned_total_) {
        warned_total_ = true;
        TETHER_LOG(kWarning) << "dashboard: " << total_
                             << " connections open (--http-max-clients); "
                                "refusing more";
      }
      *refusal = "too many dashboard clients (--http-max-clients)";
      return nullptr;
    }
    Count& count = by_client_[client];
    if (count.open >= max_per_client_) {
      if (!count.warned) {
        count.warned = true;
        TETHER_LOG(kWarning)
            << "dashboard: " << count.open << " connections open from "
            << client.to_string()
            << " (--http-max-clients-per-address); refusing more from it";
      }
      *refusal = "too many dashboard connections from " + client.to_string() +
                 " (--http-max-clients-per-address)";
      return nullptr;
    }
    ++count.open;
    ++total_;
    return std::make_unique<Slot>(this, client);
  }

 private:
  friend class Slot;
  void GiveBack(const asio::ip::address& client) TETHER_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    --total_;
    if (total_ < max_total_) warned_total_ = false;
    auto it = by_client_.find(client);
    if (it == by_client_.end()) return;
    if (--it->second.open < max_per_client_) it->second.warned = false;
    if (it->second.open == 0) by_client_.erase(it);
  }

  struct Count {
    int open = 0;
    bool warned = false;  // its refusal was logged
  };
  const int max_total_;
  const int max_per_client_;
  Mutex mu_;
  int total_ TETHER_GUARDED_BY(mu_) = 0;
  bool warned_total_ TETHER_GUARDED_BY(mu_) = false;
  // Only clients with some.
  std::map<asio::ip::address, Count> by_client_ TETHER_GUARDED_BY(mu_);
};

Slot::~Slot() { places_->GiveBack(client_); }

// Anything Stop() must be able to close.
class Closable {
 public:
  virtual ~Closable() = default;
  virtual void Close() = 0;
};

// A WebSocket client as Publish sees it, whichever stream it runs on.
class Subscriber : public Closable {
 public:
  // Any thread; the message goes out in the order of Send calls, unless
  // the greeting covered it (`seq` is not after the greeting's).
  virtual void Send(std::shared_ptr<const std::string> message,
                    uint64_t seq) = 0;
};

// The two streams a session runs on: plain TCP, or TLS over it (HTTPS and
// WSS, with HttpOptions::tls). The session logic is the same for both;
// what differs (the handshake, TLS's close_notify) is `if constexpr`.
using PlainStream = beast::tcp_stream;
using HttpsStream = beast::ssl_stream<beast::tcp_stream>;
template <class Stream>
constexpr bool kTls = std::is_same_v<Stream, HttpsStream>;

using RequestParser = http::request_parser<http::string_body>;

// A parser for one request under the dashboard's limits.
void Limit(RequestParser& parser, const HttpOptions& options) {
  parser.header_limit(static_cast<std::uint32_t>(options.header_limit));
  parser.body_limit(options.body_limit);
}

// A connection that ended the ordinary way: the peer closed it (a browser
// closing its tab: end of stream, a reset, a socket no longer connected,
// a broken pipe, a TLS connection closed without its close_notify), or
// the server is stopping. Logged at debug, not as news.
bool OrdinaryEnding(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == websocket::error::closed ||
         ec == asio::error::connection_reset ||
         ec == asio::error::connection_aborted ||
         ec == asio::error::not_connected || ec == asio::error::broken_pipe ||
         ec == asio::error::operation_aborted ||
         ec == asio::ssl::error::stream_truncated;
}

// The status and text a request the parser refused is answered with.
std::pair<int, std::string> Refusal(const beast::error_code& ec) {
  if (ec == http::error::header_limit) {
    return {431, "request headers too large (--http-header-limit)"};
  }
  if (ec == http::error::body_limit) {
    return {413, "request body too large (--http-body-limit)"};
  }
  return {400, "bad request: " + ec.message()};
}

// The path of a request target, without its query string.
std::string PathOf(const http::request<http::string_body>& request) {
  std::string target(request.target());
  if (size_t q = target.find('?'); q != std::string::npos) target.resize(q);
  return target;
}

HttpRequest ToRequest(http::request<http::string_body>& request,
                      std::string peer) {
  return HttpRequest{std::string(request.method_string()),
                     PathOf(request),
                     std::move(request.body()),
                     std::string(request[http::field::host]),
                     std::string(request[http::field::origin]),
                     std::string(request[http::field::authorization]),
                     std::move(peer)};
}

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(asio::io_context& io, HttpOptions o, std::string ws_path, Handler h,
       Greeting g)
      : io(io),
        options(std::move(o)),
        websocket_path(std::move(ws_path)),
        handler(std::move(h)),
        greeting(std::move(g)),
        acceptor(asio::make_strand(io)),
        places(options) {}

  void DoAccept();
  void Track(const std::shared_ptr<Closable>& c) TETHER_EXCLUDES(mu) {
    MutexLock lock(&mu);
    std::erase_if(open, [](auto& w) { return w.expired(); });
    open.push_back(c);
  }

  asio::io_context& io;
  const HttpOptions options;
  const std::string websocket_path;
  const Handler handler;
  const Greeting greeting;
  tcp::acceptor acceptor;
  std::string address;
  bool loopback = false;
  // Set by Bind(), before any session: null serves plain HTTP.
  std::shared_ptr<asio::ssl::context> https;
  Places places;
  std::atomic<uint64_t> dropped{0};
  std::atomic<bool> stopped{false};

  mutable Mutex mu;
  std::vector<std::weak_ptr<Closable>> open TETHER_GUARDED_BY(mu);
  std::vector<std::weak_ptr<Subscriber>> websockets TETHER_GUARDED_BY(mu);
};

namespace {

using Server = HttpServer::Impl;

// A WebSocket client: its greeting, then every published message, in
// order. Writes one message at a time; when more than options.ws_queue are
// waiting, or the peer stops answering pings, the client is dropped.
template <class Stream>
class WebSocketSession
    : public Subscriber,
      public std::enable_shared_from_this<WebSocketSession<Stream>> {
 public:
  WebSocketSession(std::shared_ptr<Server> server, Stream stream,
                   std::unique_ptr<Slot> slot)
      : server_(std::move(server)),
        ws_(std::move(stream)),
        slot_(std::move(slot)) {}

  void Start(http::request<http::string_body> request) {
    beast::get_lowest_layer(ws_).expires_never();
    websocket::stream_base::timeout timeout{};
    timeout.handshake_timeout =
        std::chrono::milliseconds(server_->options.timeout_ms);
    timeout.idle_timeout =
        std::chrono::milliseconds(server_->options.timeout_ms);
    timeout.keep_alive_pings = true;
    ws_.set_option(timeout);
    ws_.read_message_max(server_->options.ws_message_limit);
    ws_.set_option(
        websocket::stream_base::decorator([](websocket::response_type& res) {
          res.set(http::field::server, "tether");
        }));
    ws_.async_accept(request,
                     [self = this->shared_from_this()](beast::error_code ec) {
                       self->OnAccept(ec);
                     });
  }

  void Send(std::shared_ptr<const std::string> message, uint64_t seq) override {
    asio::post(ws_.get_executor(), [self = this->shared_from_this(), seq,
                                    message = std::move(message)]() mutable {
      if (seq > self->greeted_seq_) self->Enqueue(std::move(message));
    });
  }

  void Close() override {
    asio::post(ws_.get_executor(), [self = this->shared_from_this()] {
      self->Fail("closed: the server stops", LogLevel::kDebug);
    });
  }

 private:
  void OnAccept(beast::error_code ec) {
    if (ec) return Fail("handshake: " + ec.message(), LevelFor(ec));
    {
      MutexLock lock(&server_->mu);
      if (server_->stopped) {
        return Fail("closed: the server stops", LogLevel::kDebug);
      }
      std::erase_if(server_->websockets, [](auto& w) { return w.expired(); });
      server_->websockets.push_back(this->shared_from_this());
    }
    // Built after joining the list, without the lock: a message published
    // from now on is either covered by the greeting (and skipped) or newer.
    // Sends wait on this strand, so the greeting goes first.
    WsMessage greeting = server_->greeting();
    greeted_seq_ = greeting.seq;
    Enqueue(std::make_shared<const std::string>(std::move(greeting.text)));
    DoRead();
  }

  void DoRead() {
    ws_.async_read(
        in_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
          if (ec == beast::error::timeout) {
            // It stopped answering pings: a browser gone, or one not reading.
            ++self->server_->dropped;
            return self->Fail("dropped: silent for --http-timeout-ms");
          }
          if (ec) return self->Fail("read: " + ec.message(), LevelFor(ec));
          self->in_.consume(self->in_.size());  // browsers have nothing to say
          self->DoRead();
        });
  }

  void Enqueue(std::shared_ptr<const std::string> message) {
    if (closed_) return;
    if (queue_.size() >= static_cast<size_t>(server_->options.ws_queue)) {
      ++server_->dropped;
      return Fail("dropped: " + std::to_string(queue_.size()) +
                  " messages waiting (--ws-queue)");
    }
    queue_.push_back(std::move(message));
    if (queue_.size() == 1) DoWrite();
  }

  void DoWrite() {
    ws_.text(true);
    ws_.async_write(
        asio::buffer(*queue_.front()),
        [self = this->shared_from_this()](beast::error_code ec, size_t) {
          if (ec == beast::error::timeout) {
            ++self->server_->dropped;  // it stopped reading
            return self->Fail("dropped: write timed out");
          }
          if (ec) {
            return self->Fail("write: " + ec.message(), LevelFor(ec));
          }
          self->queue_.pop_front();
          if (!self->queue_.empty()) self->DoWrite();
        });
  }

  static LogLevel LevelFor(const beast::error_code& ec) {
    return OrdinaryEnding(ec) ? LogLevel::kDebug : LogLevel::kInfo;
  }

  // Closes the connection once, logging `why` at `level`. A dropped TLS
  // client is cut off too, without a close_notify: it is not listening.
  void Fail(const std::string& why, LogLevel level = LogLevel::kInfo) {
    if (closed_) return;
    closed_ = true;
    queue_.clear();
    if (LogEnabled(level)) {
      LogLine(level, "dashboard client " + peer_ + " " + why);
    }
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both,
                                                   ignored);
    beast::get_lowest_layer(ws_).close();
  }

  const std::shared_ptr<Server> server_;
  websocket::stream<Stream> ws_;
  std::unique_ptr<Slot> slot_;
  beast::flat_buffer in_;
  std::deque<std::shared_ptr<const std::string>> queue_;  // on the strand
  bool closed_ = false;                                   // on the strand
  uint64_t greeted_seq_ = 0;                              // on the strand
  const std::string peer_ = PeerAddress(beast::get_lowest_layer(ws_).socket());
};

// One HTTP connection: over TLS, the handshake first; then requests in
// turn (keep-alive), each read whole within the timeout, each answered by
// the handler; an upgrade on the WebSocket path becomes a
// WebSocketSession on the same stream.
template <class Stream>
class HttpSession : public Closable,
                    public std::enable_shared_from_this<HttpSession<Stream>> {
 public:
  // `slot` is the connection's place under the caps; null when it got
  // none, and is answered 503 with `refusal` (over TLS: closed at once, as
  // a handshake would let a client over the cap hold connections for
  // --http-timeout-ms each; the refusal is logged by Places).
  HttpSession(std::shared_ptr<Server> server, Stream stream,
              std::unique_ptr<Slot> slot, std::string refusal)
      : server_(std::move(server)),
        stream_(std::move(stream)),
        slot_(std::move(slot)),
        refusal_(std::move(refusal)) {}

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls<Stream>) {
        if (self->slot_ == nullptr) return self->Lowest().close();
        return self->DoHandshake();
      } else {
        if (self->slot_ == nullptr) {
          return self->Answer(503, self->refusal_, false);
        }
        self->DoRead();
      }
    });
  }

  void Close() override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this()] {
      beast::error_code ignored;
      self->Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
      self->Lowest().close();
    });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }
  std::chrono::milliseconds Timeout() const {
    return std::chrono::milliseconds(server_->options.timeout_ms);
  }

  // TLS only: within the time a request has to arrive in. A client that
  // fails it (one speaking plain HTTP, say) gets no answer, only a line in
  // the log.
  void DoHandshake() {
    Lowest().expires_after(Timeout());
    stream_.async_handshake(
        asio::ssl::stream_base::server,
        [self = this->shared_from_this()](beast::error_code ec) {
          if (!ec) return self->DoRead();
          if (ec == asio::error::operation_aborted) {
            TETHER_LOG(kDebug) << "dashboard: TLS handshake with "
                               << self->Peer() << " stopped (the server stops)";
          } else {
            TETHER_LOG(kInfo) << "dashboard: TLS handshake with "
                              << self->Peer() << " failed: "
                              << (ec == beast::error::timeout
                                      ? "timed out (--http-timeout-ms)"
                                      : TlsError(ec));
          }
          self->Lowest().close();
        });
  }

  void DoRead() {
    parser_.emplace();
    Limit(*parser_, server_->options);
    Lowest().expires_after(Timeout());
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](
                         beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (OrdinaryEnding(ec)) {
      TETHER_LOG(kDebug) << "dashboard: " << Peer()
                         << " closed the connection (" << ec.message() << ")";
      if constexpr (kTls<Stream>) {
        // Its close_notify came: answer with ours.
        if (ec == http::error::end_of_stream) return Shutdown();
      }
      return Lowest().close();
    }
    if (ec == beast::error::timeout) {
      TETHER_LOG(kDebug) << "dashboard: request from " << Peer()
                         << " timed out (--http-timeout-ms)";
      return Lowest().close();
    }
    if (ec) {
      auto [status, why] = Refusal(ec);
      return Answer(status, why, false);
    }

    http::request<http::string_body> request = parser_->release();
    if (websocket::is_upgrade(request)) return Upgrade(std::move(request));
    HttpResponse answer = server_->handler(ToRequest(request, Peer()));
    Write(answer, request.keep_alive(), request.version());
  }

  void Upgrade(http::request<http::string_body> request) {
    const std::string target = PathOf(request);
    if (target != server_->websocket_path) {
      return Answer(404, "no WebSocket at " + target, false);
    }
    // Browsers let any site open WebSockets anywhere; only the page's
    // own origin may (tools that send no Origin are welcome).
    std::string origin(request[http::field::origin]);
    if (!origin.empty() &&
        origin != kScheme + std::string(request[http::field::host])) {
      TETHER_LOG(kWarning) << "dashboard: refused WebSocket " << target
                           << " from " << Peer() << ": cross-origin (Origin "
                           << ForLog(origin) << ")";
      return Answer(403, "cross-origin WebSocket from " + origin + " refused",
                    false);
    }
    auto ws = std::make_shared<WebSocketSession<Stream>>(
        server_, std::move(stream_), std::move(slot_));
    server_->Track(ws);
    ws->Start(std::move(request));
  }

  void Answer(int status, const std::string& text, bool keep_alive) {
    HttpResponse r;
    r.status = status;
    r.content_type = "text/plain; charset=utf-8";
    r.body = text + "\n";
    Write(r, keep_alive, 11);
  }

  void Write(const HttpResponse& answer, bool keep_alive, unsigned version) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(answer.status), version);
    res->set(http::field::server, "tether");
    res->set(http::field::content_type, answer.content_type);
    res->set(http::field::cache_control, "no-store");
    res->set("X-Content-Type-Options", "nosniff");
    // The page loads nothing from anywhere else and is framed by no one.
    res->set("Content-Security-Policy",
             "default-src 'self'; connect-src 'self'; frame-ancestors 'none'");
    if (!answer.allow.empty()) res->set(http::field::allow, answer.allow);
    if (!answer.www_authenticate.empty()) {
      res->set(http::field::www_authenticate, answer.www_authenticate);
    }
    res->body() = answer.body;
    res->keep_alive(keep_alive);
    res->prepare_payload();
    Lowest().expires_after(Timeout());
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res, keep_alive](
                          beast::error_code ec, size_t) {
                        if (ec || !keep_alive) return self->End(ec);
                        self->DoRead();
                      });
  }

  // After the last answer (or a failed write): plain TCP half-closes;
  // TLS sends its close_notify unless the write failed.
  void End(beast::error_code ec) {
    if constexpr (kTls<Stream>) {
      if (!ec) return Shutdown();
    }
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Lowest().close();
  }

  // TLS's close_notify both ways, within the timeout; the socket is closed
  // however that ends.
  void Shutdown() {
    Lowest().expires_after(Timeout());
    stream_.async_shutdown(
        [self = this->shared_from_this()](beast::error_code ec) {
          if (ec && !OrdinaryEnding(ec)) {
            TETHER_LOG(kDebug) << "dashboard: TLS shutdown with "
                               << self->Peer() << ": " << TlsError(ec);
          }
          self->Lowest().close();
        });
  }

  std::string Peer() { return PeerAddress(Lowest().socket()); }

  // What a page served here calls its origin.
  static constexpr const char* kScheme = kTls<Stream> ? "https://" : "http://";

  const std::shared_ptr<Server> server_;
  Stream stream_;
  std::unique_ptr<Slot> slot_;
  const std::string refusal_;
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
};

// Starts a session for an accepted connection, tracked for Stop().
template <class Stream>
void Open(const std::shared_ptr<Server>& server, Stream stream,
          std::unique_ptr<Slot> slot, std::string refusal) {
  auto session = std::make_shared<HttpSession<Stream>>(
      server, std::move(stream), std::move(slot), std::move(refusal));
  server->Track(session);
  session->Start();
}

}  // namespace

void HttpServer::Impl::DoAccept() {
  acceptor.async_accept(
      asio::make_strand(io),
      [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
        if (self->stopped) return;
        if (ec) {
          TETHER_LOG(kWarning) << "dashboard: accept failed: " << ec.message();
        } else {
          beast::error_code ignored;
          const asio::ip::address from =
              socket.remote_endpoint(ignored).address();
          std::string refusal;
          std::unique_ptr<Slot> slot = self->places.Take(from, &refusal);
          if (self->https) {
            Open(self, HttpsStream(std::move(socket), *self->https),
                 std::move(slot), std::move(refusal));
          } else {
            Open(self, PlainStream(std::move(socket)), std::move(slot),
                 std::move(refusal));
          }
        }
        self->DoAccept();
      });
}

HttpServer::HttpServer(asio::io_context& io, HttpOptions options,
                       std::string websocket_path, Handler handler,
                       Greeting greeting)
    : impl_(std::make_shared<Impl>(io, std::move(options),
                                   std::move(websocket_path),
                                   std::move(handler), std::move(greeting))) {}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Bind() {
  // The certificate before the port: a bad --tls-cert or --tls-key stops
  // the start, naming the flag and file.
  TETHER_ASSIGN_OR_RETURN(impl_->https, MakeHttpsContext(impl_->options.tls));
  auto bound = Listen(impl_->acceptor, impl_->options.listen, "--http");
  if (!bound.ok()) {
    if (bound.status().code() != Code::kUnavailable) return bound.status();
    return Unavailable(bound.status().message() +
                       " (--http 127.0.0.1:0 picks a free port, --http off "
                       "serves no dashboard)");
  }
  impl_->address = bound->ToString();
  beast::error_code ec;
  const tcp::endpoint local = impl_->acceptor.local_endpoint(ec);
  impl_->loopback = !ec && local.address().is_loopback();
  return Status::Ok();
}

void HttpServer::Start() { impl_->DoAccept(); }

std::string HttpServer::address() const { return impl_->address; }

bool HttpServer::loopback() const { return impl_->loopback; }

const char* HttpServer::scheme() const {
  return impl_->options.tls.enabled() ? "https://" : "http://";
}

void HttpServer::Publish(WsMessage message) {
  // As Beast's broadcast example: the list is copied under the lock, the
  // messages are sent without it.
  std::vector<std::shared_ptr<Subscriber>> clients;
  {
    MutexLock lock(&impl_->mu);
    std::erase_if(impl_->websockets, [](auto& w) { return w.expired(); });
    for (auto& weak : impl_->websockets) {
      if (auto ws = weak.lock()) clients.push_back(std::move(ws));
    }
  }
  if (clients.empty()) return;
  auto text = std::make_shared<const std::string>(std::move(message.text));
  for (auto& ws : clients) ws->Send(text, message.seq);
}

size_t HttpServer::websocket_clients() const {
  MutexLock lock(&impl_->mu);
  size_t n = 0;
  for (auto& w : impl_->websockets) n += !w.expired();
  return n;
}

uint64_t HttpServer::dropped_clients() const { return impl_->dropped.load(); }

void HttpServer::Stop() {
  if (impl_->stopped.exchange(true)) return;
  asio::post(impl_->acceptor.get_executor(), [impl = impl_] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
  });
  std::vector<std::shared_ptr<Closable>> open;
  {
    MutexLock lock(&impl_->mu);
    for (auto& w : impl_->open) {
      if (auto c = w.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) c->Close();
}

std::string ForLog(std::string_view text) {
  constexpr size_t kMax = 120;
  std::string out;
  for (char c : text.substr(0, kMax)) {
    out += c >= 0x20 && c < 0x7f ? c : '?';
  }
  if (text.size() > kMax) out += "...";
  return out;
}

ParsedRequest ParseHttpRequest(std::string_view bytes,
                               const HttpOptions& options) {
  RequestParser parser;
  Limit(parser, options);
  parser.eager(true);
  beast::error_code ec;
  while (!ec && !bytes.empty() && !parser.is_done()) {
    const size_t used =
        parser.put(asio::buffer(bytes.data(), bytes.size()), ec);
    if (ec == http::error::need_more) break;
    if (used == 0 && !ec) break;
    bytes.remove_prefix(used);
  }
  if (!ec && !parser.is_done()) {
    if (!parser.got_some()) return {400, "bad request: no request", {}};
    parser.put_eof(ec);
  }
  if (ec || !parser.is_done()) {
    auto [status, why] = Refusal(ec ? ec : http::error::partial_message);
    return {status, why, {}};
  }
  http::request<http::string_body> request = parser.release();
  if (websocket::is_upgrade(request)) {
    return {101, "a WebSocket upgrade", {}};
  }
  return {0, "", ToRequest(request, "fuzzer")};
}

}  // namespace tether
