// Shared-secret authentication for connections to a shard.
//
// Every process of a run may be given the same key (--auth-key-file). A
// keyed peer (worker, tool, or shard registering with the coordinator) and a
// keyed shard prove to each other that they hold it:
//
//   peer  -> shard  Hello     auth_nonce = Cn (32 fresh random bytes)
//   shard -> peer   Challenge nonce = Sn (fresh), proof = HMAC(K, shard|Cn|Sn)
//   peer  -> shard  Hello     the same fields, auth_proof =
//                             HMAC(K, hello|Sn|Cn|role|rank|shard_id)
//   shard -> peer   Welcome, or Error AuthFailed
//
// (HMAC-SHA256, each part length-prefixed.) The key never crosses the wire,
// and both nonces are fresh per connection, so a recorded Hello answers no
// later challenge: replaying it is refused. This authenticates the
// handshake; it does not encrypt or sign the frames that follow, so on a
// network where someone can rewrite TCP streams, run tether inside a VPN
// (WireGuard, an SSH tunnel).
//
// A keyed shard refuses a Hello without a nonce; an unkeyed shard refuses a
// Hello with one (the two sides disagree: a clear error beats a silent
// downgrade); a keyed peer refuses a shard that answers without a Challenge.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "schema/frame.h"
#include "schema/status.h"
#include "schema/tether_generated.h"

namespace tether {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kMinAuthKeyBytes = 16;

class AuthKey {
 public:
  // Reads the key from the file at `path`: its bytes, less trailing
  // whitespace; at least kMinAuthKeyBytes of them. Errors name `flag` and
  // the path. Warns (once, in the log) when other users may read the file.
  static Result<std::shared_ptr<const AuthKey>> Load(const std::string& path,
                                                     const std::string& flag);
  explicit AuthKey(std::string bytes) : bytes_(std::move(bytes)) {}

  // HMAC-SHA256 under this key of `label` and `parts`, each prefixed with
  // its length (so no two different lists give the same input).
  std::string Mac(std::string_view label,
                  std::initializer_list<std::string_view> parts) const;
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// kAuthNonceBytes from the operating system's random source.
std::string NewNonce();

// The shard's proof (in its Challenge) and the peer's (in its second Hello).
std::string ShardProof(const AuthKey& key, std::string_view peer_nonce,
                       std::string_view shard_nonce);
std::string HelloProof(const AuthKey& key, std::string_view shard_nonce,
                       std::string_view peer_nonce, wire::Role role, int rank,
                       int shard_id);

// Constant-time comparison of two proofs.
bool SameProof(std::string_view a, std::string_view b);

// A bearer token (the dashboard's): read from the file at `path`, less
// trailing whitespace, at least kMinAuthKeyBytes; when the file does not
// exist, a fresh random token (64 hex digits) is written there, mode 600.
// Errors name `flag` and the path.
Result<std::string> LoadOrCreateToken(const std::string& path,
                                      const std::string& flag);

// What a peer says in its Hello.
struct HelloFields {
  wire::Role role = wire::Role::Observer;
  int rank = -1;
  int staleness = 0;
  int shard_id = -1;
  std::string address;  // shards: where they listen
  std::string name;
  int64_t clock = -1;
  std::string command;  // the peer's command line, shell-quoted; "" none
  // A shard re-registering with a restarted coordinator: the run it serves.
  std::string serving_run_id;
  std::string manifest;  // the peer's part of the run manifest (JSON); ""
  int direct_pid =
      0;              // a worker offering its memory (Hello.direct_pid); 0 none
  std::string nonce;  // set by PeerAuth
  std::string proof;  // set by PeerAuth
};

OutFrame MakeHelloFrame(const HelloFields& hello);

// The peer's side of the handshake. `key` null: no authentication.
class PeerAuth {
 public:
  explicit PeerAuth(std::shared_ptr<const AuthKey> key)
      : key_(std::move(key)) {}

  // The first Hello: `hello` with a fresh nonce when keyed.
  OutFrame First(HelloFields hello);
  // The shard (described by `peer`) answered the first Hello with
  // `challenge`: checks its proof and returns the second Hello.
  Result<OutFrame> Answer(const wire::Challenge& challenge,
                          const std::string& peer);
  // The shard answered with a Welcome: refused when keyed and no Challenge
  // came first (a shard without the key, or an impostor).
  Status CheckWelcome(const std::string& peer) const;

 private:
  std::shared_ptr<const AuthKey> key_;
  HelloFields hello_;
  bool answered_ = false;
};

// The shard's side of the handshake, one per connection. `key` null: no
// authentication (and a Hello asking for it is refused).
class ShardAuth {
 public:
  explicit ShardAuth(std::shared_ptr<const AuthKey> key)
      : key_(std::move(key)) {}

  // A Hello arrived. OK with nullopt: go on with this Hello. OK with a
  // frame: send it (the Challenge) and wait for the next Hello. Otherwise
  // kAuthFailed saying why (no key, wrong key, replay).
  Result<std::optional<OutFrame>> OnHello(const wire::Hello& hello);

 private:
  std::shared_ptr<const AuthKey> key_;
  std::string peer_nonce_;
  std::string nonce_;  // set once the Challenge is out
};

}  // namespace tether
