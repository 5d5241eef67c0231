#include "schema/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/ssl/error.hpp>
#include <fstream>

namespace tether {
namespace asio = boost::asio;
namespace ssl = asio::ssl;

namespace {

// kInvalidArgument naming the flag and file, unless `path` can be opened.
Status Readable(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgument(flag + ": cannot read '" + path +
                           "': " + std::strerror(errno));
  }
  return Status::Ok();
}

// Loads this side's certificate chain and key, and the CA peers are
// checked against.
Status Load(ssl::context& ctx, const TlsOptions& o, bool with_ca) {
  boost::system::error_code ec;
  TETHER_RETURN_IF_ERROR(Readable("--tls-cert", o.cert_file));
  ctx.use_certificate_chain_file(o.cert_file, ec);
  if (ec) {
    return InvalidArgument("--tls-cert: '" + o.cert_file +
                           "' is not a PEM certificate: " + TlsError(ec));
  }
  TETHER_RETURN_IF_ERROR(Readable("--tls-key", o.key_file));
  ctx.use_private_key_file(o.key_file, ssl::context::pem, ec);
  if (ec) {
    // OpenSSL checks the key against the certificate as it loads it: a key
    // that loads alone is another certificate's.
    ssl::context alone(ssl::context::tls_server);
    boost::system::error_code alone_ec;
    alone.use_private_key_file(o.key_file, ssl::context::pem, alone_ec);
    if (!alone_ec) {
      return InvalidArgument("--tls-key: '" + o.key_file +
                             "' does not match the certificate in '" +
                             o.cert_file + "'");
    }
    return InvalidArgument("--tls-key: '" + o.key_file +
                           "' is not a PEM private key: " + TlsError(ec));
  }
  if (!with_ca) return Status::Ok();
  TETHER_RETURN_IF_ERROR(Readable("--tls-ca", o.ca_file));
  ctx.load_verify_file(o.ca_file, ec);
  if (ec) {
    return InvalidArgument("--tls-ca: '" + o.ca_file +
                           "' holds no PEM certificate: " + TlsError(ec));
  }
  return Status::Ok();
}

std::shared_ptr<ssl::context> NewContext(ssl::context::method method) {
  auto ctx = std::make_shared<ssl::context>(method);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                   ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  return ctx;
}

}  // namespace

void BindTlsFlags(FlagParser& parser, TlsOptions* options) {
  parser.AddString("tls-cert", &options->cert_file,
                   "PEM certificate (chain) of this process: with --tls-key "
                   "and --tls-ca every shard connection speaks TLS (and the "
                   "dashboard HTTPS); every process of the run needs them");
  parser.AddString("tls-key", &options->key_file,
                   "PEM private key of --tls-cert");
  parser.AddString("tls-ca", &options->ca_file,
                   "PEM certificate of the CA that signs every process's "
                   "certificate; peers without one it signed are refused "
                   "(mutual TLS)");
}

Status CheckTlsOptions(const TlsOptions& o) {
  if (!o.enabled()) return Status::Ok();
  if (o.cert_file.empty()) {
    return InvalidArgument("--tls-cert: required with --tls-key or --tls-ca");
  }
  if (o.key_file.empty()) {
    return InvalidArgument("--tls-key: required with --tls-cert");
  }
  if (o.ca_file.empty()) {
    return InvalidArgument(
        "--tls-ca: required with --tls-cert (every peer's certificate is "
        "checked against it)");
  }
  return Status::Ok();
}

Result<std::shared_ptr<ssl::context>> MakeTlsContext(const TlsOptions& o,
                                                     TlsRole role) {
  if (!o.enabled()) return std::shared_ptr<ssl::context>();
  TETHER_RETURN_IF_ERROR(CheckTlsOptions(o));
  auto ctx = NewContext(role == TlsRole::kServer ? ssl::context::tls_server
                                                 : ssl::context::tls_client);
  TETHER_RETURN_IF_ERROR(Load(*ctx, o, true));
  // Peers are named by whatever address the user gave (an IP, a Kubernetes
  // DNS name, a Slurm host name): what they prove is that the run's CA
  // signed them, not a host name.
  ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  return ctx;
}

Result<std::shared_ptr<ssl::context>> MakeHttpsContext(const TlsOptions& o) {
  if (!o.enabled()) return std::shared_ptr<ssl::context>();
  TETHER_RETURN_IF_ERROR(CheckTlsOptions(o));
  auto ctx = NewContext(ssl::context::tls_server);
  TETHER_RETURN_IF_ERROR(Load(*ctx, o, false));
  ctx->set_verify_mode(ssl::verify_none);
  return ctx;
}

std::string TlsError(const boost::system::error_code& ec) {
  if (ec.category() == asio::error::get_ssl_category()) {
    const char* reason = ERR_reason_error_string(ec.value());
    if (reason != nullptr && std::string(reason) == "wrong version number") {
      return std::string(reason) +
             " (the peer does not speak TLS: was it started without "
             "--tls-cert?)";
    }
    if (reason != nullptr) return reason;
  }
  if (ec == asio::ssl::error::stream_truncated || ec == asio::error::eof) {
    return "the peer closed the connection during the TLS handshake";
  }
  return ec.message();
}

}  // namespace tether
