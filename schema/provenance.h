// Where a process runs and what it reads, for run manifests: the host's
// name and a file's SHA-256. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "schema/status.h"

namespace tether {

// This host's name (gethostname); "unknown" when it has none.
std::string HostName();

struct FileDigest {
  std::string sha256;  // 64 lowercase hex digits
  uint64_t bytes = 0;
};
// The SHA-256 of the file at `path`, read whole. kNotFound or kIoError
// naming the file.
Result<FileDigest> Sha256File(const std::string& path);

}  // namespace tether
