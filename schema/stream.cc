#include "schema/stream.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <future>

namespace tether {

std::string PeerAddress(const tcp::socket& socket) {
  boost::system::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  if (ec) return "unknown peer";
  return HostPort{ep.address().to_string(), ep.port()}.ToString();
}

namespace {

// One handshake in flight: the stream and the timer that bounds it, held
// by both handlers; whichever finishes first decides.
struct Handshake {
  Handshake(tcp::socket socket, std::shared_ptr<asio::ssl::context> ctx)
      : context(std::move(ctx)),
        peer(PeerAddress(socket)),
        stream(std::make_unique<TlsStream>(std::move(socket), *context)),
        timer(stream->get_executor()) {}

  std::shared_ptr<asio::ssl::context> context;  // outlives the stream
  std::string peer;
  std::unique_ptr<TlsStream> stream;
  asio::steady_timer timer;
  bool timed_out = false;
  std::function<void(Result<Stream>)> done;
};

}  // namespace

void AsyncTlsHandshake(tcp::socket socket,
                       std::shared_ptr<asio::ssl::context> context,
                       TlsRole role, int timeout_ms,
                       std::function<void(Result<Stream>)> done) {
  // Before the handshake's small messages, not only after (Connection sets
  // it again): Nagle's delay would hold each flight back.
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  auto h = std::make_shared<Handshake>(std::move(socket), std::move(context));
  h->done = std::move(done);
  // Both handlers run on the socket's executor (a strand, or one thread).
  asio::post(h->stream->get_executor(), [h, role, timeout_ms] {
    h->timer.expires_after(std::chrono::milliseconds(timeout_ms));
    h->timer.async_wait([h](const boost::system::error_code& ec) {
      if (ec) return;  // the handshake finished first
      h->timed_out = true;
      boost::system::error_code ignored;
      h->stream->next_layer().close(ignored);
    });
    h->stream->async_handshake(
        role == TlsRole::kServer ? asio::ssl::stream_base::server
                                 : asio::ssl::stream_base::client,
        [h, timeout_ms](const boost::system::error_code& ec) {
          h->timer.cancel();
          if (!ec && !h->timed_out)
            return h->done(Stream(std::move(h->stream)));
          const std::string why =
              h->timed_out
                  ? "not done within " + std::to_string(timeout_ms) + " ms"
                  : TlsError(ec);
          boost::system::error_code ignored;
          h->stream->next_layer().close(ignored);
          h->done(
              Unavailable("TLS handshake with " + h->peer + " failed: " + why));
        });
  });
}

Result<Stream> TlsConnect(tcp::socket socket,
                          std::shared_ptr<asio::ssl::context> context,
                          int timeout_ms) {
  if (!context) return Stream(std::move(socket));
  auto result = std::make_shared<std::promise<Result<Stream>>>();
  auto future = result->get_future();
  AsyncTlsHandshake(std::move(socket), std::move(context), TlsRole::kClient,
                    timeout_ms, [result](Result<Stream> stream) {
                      result->set_value(std::move(stream));
                    });
  return future.get();
}

}  // namespace tether
