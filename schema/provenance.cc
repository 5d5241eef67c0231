#include "schema/provenance.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

namespace tether {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "unknown";
  }
  return name;
}

Result<FileDigest> Sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return NotFound(path + ": no such file");
    return Status(Code::kIoError,
                  path + ": cannot read: " + std::strerror(err));
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                              &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Internal("SHA-256 unavailable in OpenSSL");
  }
  FileDigest digest;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buffer.data(), n);
    digest.bytes += n;
  }
  if (in.bad()) {
    return Status(Code::kIoError, path + ": read failed");
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < len; ++i) {
    digest.sha256.push_back(kHex[md[i] >> 4]);
    digest.sha256.push_back(kHex[md[i] & 15]);
  }
  return digest;
}

}  // namespace tether
