// The dashboard's HTTP and WebSocket transport, on Boost.Beast: a listener,
// one session per connection on a strand of its own, and WebSocket clients
// fed by Publish. What to answer is the handler's business (Dashboard);
// Beast stays in http.cc.
//
// Bounded everywhere: a cap on connections at once, and a lower one on
// those from one client address, so one client cannot take every place
// (more are answered 503 and closed), header and body limits (431, 413), a
// timeout for reading a whole request and for each write, and a bounded
// queue per WebSocket client (one that falls behind is dropped, never
// buffered without end).
//
// With options.tls (a certificate and key) it serves HTTPS and WSS only:
// each connection does the TLS handshake within the request timeout (one
// that fails it, a client speaking plain HTTP for one, is closed without
// an answer and logged with the reason), then runs as a plain one, under
// the same limits. A connection over the caps is closed at once, without a
// handshake or a 503.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "schema/status.h"
#include "server/http_options.h"

namespace tether {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // the path, without the query string
  std::string body;
  std::string host;           // the Host header
  std::string origin;         // the Origin header; empty when none was sent
  std::string authorization;  // the Authorization header
  std::string peer;           // "HOST:PORT" of the client, for logs
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string allow;             // the Allow header of a 405
  std::string www_authenticate;  // the WWW-Authenticate header of a 401
};

// One request parsed from `bytes` the way a session parses it, under
// `options`' header and body limits: `status` 0 and the request, or the
// status a session answers (400, 413, 431; 101 for a WebSocket upgrade,
// which this does not serve) and why. For tests and the fuzzer.
struct ParsedRequest {
  int status = 0;
  std::string why;
  HttpRequest request;
};
ParsedRequest ParseHttpRequest(std::string_view bytes,
                               const HttpOptions& options);

// Text a client sent (a header), fit for a log line: printable ASCII only
// (anything else becomes '?'), cut to 120 bytes.
std::string ForLog(std::string_view text);

// A message to WebSocket clients, numbered: a greeting numbered g stands
// for every published message up to g, so a client greeted with g skips
// the published ones numbered g or less.
struct WsMessage {
  uint64_t seq = 0;
  std::string text;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // Builds the first message a new WebSocket client receives.
  using Greeting = std::function<WsMessage()>;

  // `handler` answers every plain request; `greeting` every new WebSocket
  // client on `websocket_path`. Both run on I/O threads, concurrently.
  HttpServer(boost::asio::io_context& io, HttpOptions options,
             std::string websocket_path, Handler handler, Greeting greeting);
  ~HttpServer();

  // Loads options.tls's certificate and key when TLS is on, then binds
  // options.listen. kInvalidArgument naming the --tls-* flag and file that
  // could not be loaded (or a key that does not match the certificate);
  // kUnavailable naming the address when it cannot be bound.
  Status Bind();
  // Starts accepting; after a Bind() that succeeded.
  void Start();
  // "HOST:PORT" as bound (the real port when options.listen had port 0).
  std::string address() const;
  // Whether the bound address is a loopback one; after Bind().
  bool loopback() const;
  // "https://" when it serves TLS (HttpOptions::tls), else "http://".
  const char* scheme() const;

  // Sends `message` to every WebSocket client whose greeting it is newer
  // than, so each client sees its greeting and then every later message,
  // none twice. From one thread at a time, with increasing numbers. Built
  // by the caller: the server's lock covers only copying its client list.
  void Publish(WsMessage message);

  size_t websocket_clients() const;
  uint64_t dropped_clients() const;  // fell behind, or a write timed out

  // Stops accepting and closes every connection. Idempotent.
  void Stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tether
