// A small HTTP and WebSocket client (Boost.Beast) for the dashboard's tests
// and benchmark: one request at a time, every operation bounded by a
// timeout. Not thread-safe; one object per thread.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "schema/status.h"

namespace tether {

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string Header(const std::string& name) const;  // "" when absent
};

// One request to `address` (HOST:PORT). `headers` are added as given.
Result<HttpReply> HttpFetch(
    const std::string& address, const std::string& method,
    const std::string& target, const std::string& body = "",
    const std::vector<std::pair<std::string, std::string>>& headers = {},
    int timeout_ms = 5000);

class WebSocketClient {
 public:
  struct Options {
    std::string origin;      // sent as the Origin header when not empty
    int receive_buffer = 0;  // SO_RCVBUF in bytes; 0: the system's
  };
  // Connects to ws://`address``path` and completes the handshake.
  static Result<std::unique_ptr<WebSocketClient>> Connect(
      const std::string& address, const std::string& path, Options options,
      int timeout_ms = 5000);
  ~WebSocketClient();

  // The next text message; kTimeout when none came in `timeout_ms`,
  // kUnavailable when the server closed the connection.
  Result<std::string> Read(int timeout_ms);
  void Close();

  struct Impl;

 private:
  explicit WebSocketClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tether
