// The byte stream under a Connection: a connected TCP socket, or a TLS
// stream over one whose handshake is done (schema/tls.h), and the TLS
// handshakes that make one.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "schema/status.h"
#include "schema/tls.h"

namespace tether {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using TlsStream = asio::ssl::stream<tcp::socket>;

class Stream {
 public:
  // Plain TCP (implicit: a socket is a stream).
  Stream(tcp::socket socket)  // NOLINT(google-explicit-constructor)
      : plain_(std::move(socket)) {}
  // TLS, its handshake done.
  explicit Stream(std::unique_ptr<TlsStream> tls) : tls_(std::move(tls)) {}

  bool tls() const { return tls_ != nullptr; }
  // The TCP socket at the bottom (for options, the peer's address, close).
  tcp::socket& socket() { return tls_ ? tls_->next_layer() : *plain_; }
  const tcp::socket& socket() const {
    return tls_ ? tls_->next_layer() : *plain_;
  }

  // Calls `f` with the stream to read and write: the socket or the TLS
  // stream, so one asynchronous operation serves both.
  template <class F>
  void Visit(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(*plain_);
    }
  }

 private:
  std::optional<tcp::socket> plain_;
  std::unique_ptr<TlsStream> tls_;
};

// "HOST:PORT" of the socket's peer; "unknown peer" once it is gone.
std::string PeerAddress(const tcp::socket& socket);

// Runs the TLS handshake on a connected socket as `role` with `context`,
// giving up after `timeout_ms`. `done` runs on the socket's executor with
// the stream, or kUnavailable saying "TLS handshake with <peer> failed:
// <reason>" (the reason from TlsError: a peer speaking plain TCP, one
// without a certificate or with one the CA did not sign).
void AsyncTlsHandshake(tcp::socket socket,
                       std::shared_ptr<asio::ssl::context> context,
                       TlsRole role, int timeout_ms,
                       std::function<void(Result<Stream>)> done);

// The client's handshake, waited for: the socket's io_context must be run
// by other threads meanwhile. With a null `context`, the socket as is.
Result<Stream> TlsConnect(tcp::socket socket,
                          std::shared_ptr<asio::ssl::context> context,
                          int timeout_ms);

}  // namespace tether
