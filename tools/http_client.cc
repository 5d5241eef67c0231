#include "tools/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>

#include "schema/flags.h"

namespace tether {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

namespace {

Status Failed(const std::string& what, const beast::error_code& ec) {
  if (ec == beast::error::timeout)
    return Status(Code::kTimeout, what + ": timed out");
  return Unavailable(what + ": " + ec.message());
}

// Runs `io` until the operations started on it finish; their own timeouts
// (tcp_stream expiry) bound how long that takes.
void RunAll(asio::io_context& io) {
  io.restart();
  io.run();
}

Result<tcp::endpoint> Resolve(asio::io_context& io,
                              const std::string& address) {
  TETHER_ASSIGN_OR_RETURN(auto hp, ParseHostPort(address, "address"));
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(hp.host, std::to_string(hp.port), ec);
  if (ec || results.empty()) return Unavailable("cannot resolve " + address);
  return results.begin()->endpoint();
}

}  // namespace

std::string HttpReply::Header(const std::string& name) const {
  for (const auto& [key, value] : headers) {
    if (beast::iequals(key, name)) return value;
  }
  return "";
}

Result<HttpReply> HttpFetch(
    const std::string& address, const std::string& method,
    const std::string& target, const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& headers,
    int timeout_ms) {
  asio::io_context io;
  TETHER_ASSIGN_OR_RETURN(auto endpoint, Resolve(io, address));
  beast::tcp_stream stream(io);
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  beast::error_code ec;
  stream.expires_after(timeout);
  stream.async_connect(endpoint, [&](beast::error_code e) { ec = e; });
  RunAll(io);
  if (ec) return Failed("connect to " + address, ec);

  http::request<http::string_body> req(http::string_to_verb(method), target,
                                       11);
  if (req.method() == http::verb::unknown) req.method_string(method);
  req.set(http::field::host, address);
  for (const auto& [key, value] : headers) req.set(key, value);
  req.body() = body;
  req.prepare_payload();
  stream.expires_after(timeout);
  http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
  RunAll(io);
  if (ec) return Failed("send " + method + " " + target, ec);

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  stream.expires_after(timeout);
  http::async_read(stream, buffer, parser,
                   [&](beast::error_code e, size_t) { ec = e; });
  RunAll(io);
  if (ec) return Failed("read the answer to " + method + " " + target, ec);
  auto res = parser.release();
  HttpReply reply;
  reply.status = res.result_int();
  reply.content_type = std::string(res[http::field::content_type]);
  reply.body = std::move(res.body());
  for (const auto& field : res) {
    reply.headers.emplace_back(std::string(field.name_string()),
                               std::string(field.value()));
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return reply;
}

struct WebSocketClient::Impl {
  asio::io_context io;
  websocket::stream<beast::tcp_stream> ws{io};
  beast::flat_buffer buffer;
};

WebSocketClient::WebSocketClient(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

WebSocketClient::~WebSocketClient() { Close(); }

Result<std::unique_ptr<WebSocketClient>> WebSocketClient::Connect(
    const std::string& address, const std::string& path, Options options,
    int timeout_ms) {
  auto impl = std::make_unique<Impl>();
  TETHER_ASSIGN_OR_RETURN(auto endpoint, Resolve(impl->io, address));
  auto& stream = beast::get_lowest_layer(impl->ws);
  beast::error_code ec;
  stream.socket().open(endpoint.protocol(), ec);
  if (!ec && options.receive_buffer > 0) {
    stream.socket().set_option(
        asio::socket_base::receive_buffer_size(options.receive_buffer), ec);
  }
  if (ec) return Failed("socket", ec);
  stream.expires_after(std::chrono::milliseconds(timeout_ms));
  stream.async_connect(endpoint, [&](beast::error_code e) { ec = e; });
  RunAll(impl->io);
  if (ec) return Failed("connect to " + address, ec);
  if (!options.origin.empty()) {
    impl->ws.set_option(websocket::stream_base::decorator(
        [origin = options.origin](websocket::request_type& req) {
          req.set(http::field::origin, origin);
        }));
  }
  impl->ws.async_handshake(address, path, [&](beast::error_code e) { ec = e; });
  RunAll(impl->io);
  if (ec) return Failed("WebSocket handshake with " + address + path, ec);
  stream.expires_never();
  return std::unique_ptr<WebSocketClient>(new WebSocketClient(std::move(impl)));
}

Result<std::string> WebSocketClient::Read(int timeout_ms) {
  Impl& c = *impl_;
  if (!c.ws.is_open()) return Unavailable("the WebSocket is closed");
  beast::error_code ec;
  bool done = false;
  c.ws.async_read(c.buffer, [&](beast::error_code e, size_t) {
    ec = e;
    done = true;
  });
  c.io.restart();
  c.io.run_for(std::chrono::milliseconds(timeout_ms));
  if (!done) {
    // Abandon the read: the stream cannot be used for another one.
    beast::get_lowest_layer(c.ws).close();
    c.io.restart();
    c.io.run();
    return Status(Code::kTimeout, "no WebSocket message in " +
                                      std::to_string(timeout_ms) + " ms");
  }
  if (ec) return Failed("WebSocket read", ec);
  std::string message = beast::buffers_to_string(c.buffer.data());
  c.buffer.consume(c.buffer.size());
  return message;
}

void WebSocketClient::Close() {
  if (!impl_) return;
  beast::error_code ignored;
  beast::get_lowest_layer(impl_->ws).socket().shutdown(
      tcp::socket::shutdown_both, ignored);
  beast::get_lowest_layer(impl_->ws).close();
}

}  // namespace tether
