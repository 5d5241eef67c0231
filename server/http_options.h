// Settings of the dashboard's HTTP server, filled from tether-server's
// flags (see server/options.cc for each flag's meaning).
#pragma once

#include <cstdint>
#include <string>

#include "schema/tls_options.h"

namespace tether {

struct HttpOptions {
  std::string listen = "127.0.0.1:8080";  // HOST:PORT; port 0: any free one
  int max_clients = 128;             // HTTP and WebSocket connections at once
  int max_clients_per_address = 16;  // of those, from one address (IPv6: /64)
  int timeout_ms = 10000;            // to read one request, or write one answer
  uint64_t header_limit = 8192;      // bytes of request line and headers
  uint64_t body_limit = 65536;       // bytes of request body
  int ws_queue = 32;                 // WebSocket messages waiting, at most
  uint32_t ws_message_limit = 4096;  // bytes of a message from a browser
  // With a certificate and key: HTTPS and WSS only (MakeHttpsContext).
  TlsOptions tls;
};

struct DashboardOptions {
  HttpOptions http;
  int interval_ms = 250;  // between WebSocket updates
  // The bearer token that mutating endpoints (POST /api/...) require, read
  // from this file, which is created (mode 600, a fresh random token) when
  // missing. Empty: mutating endpoints are refused (403).
  std::string token_file;
  // --insecure: serve a non-loopback `http.listen` without `token_file`
  // (with a warning); otherwise Dashboard::Start refuses to.
  bool insecure = false;
};

}  // namespace tether
