// What a process needs to speak TLS (see schema/tls.h): three PEM files,
// from --tls-cert, --tls-key and --tls-ca. Plain data, so the client SDK's
// options carry it without any TLS headers.
#pragma once

#include <string>

namespace tether {

struct TlsOptions {
  std::string cert_file;  // --tls-cert: this process's certificate chain, PEM
  std::string key_file;   // --tls-key: its private key, PEM
  std::string ca_file;    // --tls-ca: the CA that signs every peer, PEM

  // TLS is on when any of the three is given (Check refuses half a set).
  bool enabled() const {
    return !cert_file.empty() || !key_file.empty() || !ca_file.empty();
  }
};

}  // namespace tether
