// Optional TLS for shard connections and the dashboard, on Asio's SSL
// stream over OpenSSL.
//
// A run either speaks TLS on every shard connection or on none: the shards,
// workers and tools of a TLS run are all given --tls-cert, --tls-key and
// --tls-ca. With --tls-ca each side also checks the other's certificate
// against that CA (mutual TLS): a peer without a certificate, or with one
// from another CA, fails the handshake and is refused with the reason
// logged. The HMAC handshake of schema/auth.h still runs inside TLS when
// the run has a key. Plain TCP stays the default.
//
// The dashboard is served over HTTPS with the same certificate and key;
// browsers are not asked for a certificate there (the token guards what
// changes the run).
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <string>

#include "schema/flags.h"
#include "schema/status.h"
#include "schema/tls_options.h"

namespace tether {

// Binds --tls-cert, --tls-key and --tls-ca to `options`.
void BindTlsFlags(FlagParser& parser, TlsOptions* options);

// Checks that a TLS set is whole: cert and key together, and a CA with
// them (a peer's certificate is always verified). kInvalidArgument naming
// the flag that is missing. OK when TLS is off.
Status CheckTlsOptions(const TlsOptions& options);

enum class TlsRole { kServer, kClient };

// A context for one side of shard connections: TLS 1.2 or later, this
// side's certificate and key, and the peer verified against the CA (a
// server requires the client's certificate). Errors name the flag and
// file that could not be read or did not parse; a key that does not match
// the certificate is refused. Null when TLS is off.
Result<std::shared_ptr<boost::asio::ssl::context>> MakeTlsContext(
    const TlsOptions& options, TlsRole role);

// A server context for the dashboard: the same certificate and key, no
// client certificate asked for. Null when TLS is off.
Result<std::shared_ptr<boost::asio::ssl::context>> MakeHttpsContext(
    const TlsOptions& options);

// The reason an SSL handshake failed, readable in a log line: OpenSSL's
// reason string ("certificate verify failed", "peer did not return a
// certificate", "wrong version number" for a peer speaking plain TCP).
std::string TlsError(const boost::system::error_code& ec);

}  // namespace tether
