#include "schema/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tether {
namespace {

Status Failed(const std::string& path, const char* what, int error) {
  return Status(Code::kIoError, "cannot " + std::string(what) + " " + path +
                                    ": " + std::strerror(error));
}

}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Failed(tmp, "create", errno);
  const char* at = text.data();
  size_t left = text.size();
  int error = 0;
  while (left > 0 && error == 0) {
    const ssize_t n = write(fd, at, left);
    if (n < 0 && errno != EINTR) error = errno;
    if (n > 0) {
      at += n;
      left -= static_cast<size_t>(n);
    }
  }
  if (error == 0 && fsync(fd) != 0) error = errno;
  if (close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = errno;
  }
  if (error != 0) {
    unlink(tmp.c_str());
    return Failed(path, "write", error);
  }
  return Status::Ok();
}

}  // namespace tether
