// The dashboard page's files (web/), embedded in the binary at build time
// by cmake/embed.cmake, so a shard serves them with no files around it.
#pragma once

#include <cstddef>
#include <string_view>

namespace tether {

struct WebAsset {
  std::string_view path;  // "/index.html", "/app.js", ...
  const unsigned char* data;
  size_t size;
};

// The asset served at `path` ("/" is "/index.html"); null when none.
const WebAsset* FindWebAsset(std::string_view path);
// Its Content-Type, from the file's extension.
std::string_view ContentType(std::string_view path);

}  // namespace tether
