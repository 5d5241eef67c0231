#include "schema/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "schema/log.h"

namespace tether {
namespace {

void AppendPart(std::string& out, std::string_view part) {
  const auto n = static_cast<uint32_t>(part.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out.append(part);
}

std::string LittleEndian(int32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<char>(static_cast<uint32_t>(v) >> (8 * i));
  }
  return out;
}

std::string_view Bytes(const flatbuffers::Vector<uint8_t>* v) {
  if (v == nullptr) return {};
  return {reinterpret_cast<const char*>(v->data()), v->size()};
}

Status AuthFailed(std::string why) {
  return Status(Code::kAuthFailed, std::move(why));
}

}  // namespace

Result<std::shared_ptr<const AuthKey>> AuthKey::Load(const std::string& path,
                                                     const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgument(flag + " " + path + ": cannot open the key file");
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string bytes = text.str();
  while (!bytes.empty() &&
         std::isspace(static_cast<unsigned char>(bytes.back()))) {
    bytes.pop_back();
  }
  if (bytes.size() < kMinAuthKeyBytes) {
    return InvalidArgument(
        flag + " " + path + ": the key is " + std::to_string(bytes.size()) +
        " bytes; use at least " + std::to_string(kMinAuthKeyBytes) +
        " (for example: head -c 32 /dev/urandom | base64 > " + path + ")");
  }
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    TETHER_LOG(kWarning) << flag << " " << path
                         << " may be read by other users; chmod 600 it";
  }
  return std::make_shared<const AuthKey>(std::move(bytes));
}

std::string AuthKey::Mac(std::string_view label,
                         std::initializer_list<std::string_view> parts) const {
  std::string input;
  AppendPart(input, label);
  for (std::string_view p : parts) AppendPart(input, p);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac,
       &n);
  return std::string(reinterpret_cast<const char*>(mac), n);
}

std::string NewNonce() {
  std::string nonce(kAuthNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()),
                 static_cast<int>(nonce.size())) != 1) {
    // Without randomness there is no safe nonce; this does not happen on a
    // working Linux system (getrandom), so stop rather than go on weakly.
    TETHER_LOG(kError) << "the system's random source failed";
    std::abort();
  }
  return nonce;
}

Result<std::string> LoadOrCreateToken(const std::string& path,
                                      const std::string& flag) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string token;
    for (unsigned char c : NewNonce()) {
      token.push_back(kHex[c >> 4]);
      token.push_back(kHex[c & 15]);
    }
    const std::string line = token + "\n";
    const bool written = ::write(fd, line.data(), line.size()) ==
                         static_cast<ssize_t>(line.size());
    const bool closed = ::close(fd) == 0;
    if (!written || !closed) {
      ::unlink(path.c_str());
      return Status(Code::kIoError,
                    flag + " " + path + ": cannot write the token file");
    }
    return token;
  }
  if (errno != EEXIST) {
    return Status(Code::kIoError, flag + " " + path + ": cannot create: " +
                                      std::strerror(errno));
  }
  TETHER_ASSIGN_OR_RETURN(auto key, AuthKey::Load(path, flag));
  return key->bytes();
}

std::string ShardProof(const AuthKey& key, std::string_view peer_nonce,
                       std::string_view shard_nonce) {
  return key.Mac("tether shard", {peer_nonce, shard_nonce});
}

std::string HelloProof(const AuthKey& key, std::string_view shard_nonce,
                       std::string_view peer_nonce, wire::Role role, int rank,
                       int shard_id) {
  const std::string r(1, static_cast<char>(role));
  return key.Mac("tether hello", {shard_nonce, peer_nonce, r,
                                  LittleEndian(rank), LittleEndian(shard_id)});
}

bool SameProof(std::string_view a, std::string_view b) {
  return a.size() == b.size() && !a.empty() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

OutFrame MakeHelloFrame(const HelloFields& h) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto address = h.address.empty() ? 0 : fbb.CreateString(h.address);
  auto name = fbb.CreateString(h.name);
  auto bytes = [&fbb](const std::string& s) {
    return s.empty()
               ? 0
               : fbb.CreateVector(reinterpret_cast<const uint8_t*>(s.data()),
                                  s.size());
  };
  auto proof = bytes(h.proof);
  auto nonce = bytes(h.nonce);
  auto command = h.command.empty() ? 0 : fbb.CreateString(h.command);
  auto serving =
      h.serving_run_id.empty() ? 0 : fbb.CreateString(h.serving_run_id);
  auto manifest = h.manifest.empty() ? 0 : fbb.CreateString(h.manifest);
  auto hello = wire::CreateHello(
      fbb, kProtocolVersion, h.role, h.rank, h.staleness, h.shard_id, address,
      proof, name, h.clock, nonce, command, serving, manifest, h.direct_pid);
  return FinishFrame(fbb, hello);
}

OutFrame PeerAuth::First(HelloFields hello) {
  hello_ = std::move(hello);
  hello_.proof.clear();
  hello_.nonce = key_ ? NewNonce() : std::string();
  answered_ = false;
  return MakeHelloFrame(hello_);
}

Result<OutFrame> PeerAuth::Answer(const wire::Challenge& challenge,
                                  const std::string& peer) {
  if (!key_) {
    return AuthFailed(peer +
                      " requires authentication: give this process "
                      "--auth-key-file with the run's key");
  }
  if (answered_) return AuthFailed(peer + " sent a second Challenge");
  const std::string_view nonce = Bytes(challenge.nonce());
  if (nonce.size() != kAuthNonceBytes ||
      !SameProof(Bytes(challenge.proof()),
                 ShardProof(*key_, hello_.nonce, nonce))) {
    return AuthFailed(peer +
                      " could not prove it holds the key: its --auth-key-file "
                      "differs from this one's, or it is not a tether shard");
  }
  answered_ = true;
  hello_.proof = HelloProof(*key_, nonce, hello_.nonce, hello_.role,
                            hello_.rank, hello_.shard_id);
  return MakeHelloFrame(hello_);
}

Status PeerAuth::CheckWelcome(const std::string& peer) const {
  if (key_ && !answered_) {
    return AuthFailed(peer +
                      " welcomed this process without authenticating (it has "
                      "no --auth-key-file); refusing to work with it");
  }
  return Status::Ok();
}

Result<std::optional<OutFrame>> ShardAuth::OnHello(const wire::Hello& hello) {
  const std::string_view nonce = Bytes(hello.auth_nonce());
  const std::string_view proof = Bytes(hello.auth_proof());
  if (!key_) {
    if (!nonce.empty() || !proof.empty()) {
      return AuthFailed(
          "this shard runs without --auth-key-file but the peer asks to "
          "authenticate: give every process of the run the same key, or "
          "none");
    }
    return std::optional<OutFrame>();
  }
  if (nonce_.empty()) {
    if (!proof.empty()) {
      return AuthFailed(
          "the Hello carries a proof for no challenge of this connection (a "
          "replayed Hello?)");
    }
    if (nonce.empty()) {
      return AuthFailed(
          "this shard requires authentication: give the peer "
          "--auth-key-file with the run's key");
    }
    if (nonce.size() != kAuthNonceBytes) {
      return AuthFailed("the Hello's nonce is " + std::to_string(nonce.size()) +
                        " bytes, not " + std::to_string(kAuthNonceBytes));
    }
    peer_nonce_ = nonce;
    nonce_ = NewNonce();
    const std::string shard_proof = ShardProof(*key_, peer_nonce_, nonce_);
    flatbuffers::FlatBufferBuilder fbb(128);
    auto n = fbb.CreateVector(reinterpret_cast<const uint8_t*>(nonce_.data()),
                              nonce_.size());
    auto p =
        fbb.CreateVector(reinterpret_cast<const uint8_t*>(shard_proof.data()),
                         shard_proof.size());
    return std::optional<OutFrame>(
        FinishFrame(fbb, wire::CreateChallenge(fbb, n, p)));
  }
  if (!nonce.empty() && nonce != peer_nonce_) {
    return AuthFailed("the second Hello's nonce differs from the first's");
  }
  const std::string expected = HelloProof(
      *key_, nonce_, peer_nonce_, hello.role(), hello.rank(), hello.shard_id());
  if (!SameProof(proof, expected)) {
    return AuthFailed(
        proof.empty()
            ? "the second Hello carries no proof"
            : "the Hello's proof does not match this connection's challenge "
              "(a wrong --auth-key-file, or a replayed Hello)");
  }
  return std::optional<OutFrame>();
}

}  // namespace tether
