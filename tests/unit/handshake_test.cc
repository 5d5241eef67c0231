// The authentication handshake (schema/auth.h), side by side in one
// process: a keyed peer and shard agree; a wrong key, a replayed or altered
// Hello, and a keyed side facing an unkeyed one are refused, saying why.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "schema/auth.h"
#include "tests/support/temp_dir.h"

namespace tether {
namespace {

using testing::TempDir;

Frame Receive(const OutFrame& out) {
  const auto body_size = static_cast<uint32_t>(out->size() - kFrameHeaderBytes);
  Frame frame(body_size);
  std::memcpy(frame.body(), out->data() + kFrameHeaderBytes, body_size);
  EXPECT_TRUE(frame.Verify().ok());
  return frame;
}

std::shared_ptr<const AuthKey> Key(const std::string& bytes) {
  return std::make_shared<const AuthKey>(bytes);
}

HelloFields Worker(int rank) {
  HelloFields h;
  h.role = wire::Role::Worker;
  h.rank = rank;
  h.staleness = 3;
  h.name = "test worker";
  return h;
}

// The bytes of a [ubyte] field (a nonce, a proof).
std::string Text(const flatbuffers::Vector<uint8_t>* v) {
  return std::string(reinterpret_cast<const char*>(v->data()), v->size());
}

const wire::Hello& HelloOf(const Frame& f) {
  return *f.message()->body_as_Hello();
}

// The frames of one handshake between `peer` and `shard`.
struct Transcript {
  Frame first, challenge, second;
};

// Runs First -> Challenge -> Answer; fails the test where a step does.
void Handshake(PeerAuth& peer, ShardAuth& shard, int rank, Transcript* t) {
  t->first = Receive(peer.First(Worker(rank)));
  auto challenge = shard.OnHello(HelloOf(t->first));
  ASSERT_TRUE(challenge.ok()) << challenge.status().ToString();
  ASSERT_TRUE(challenge->has_value()) << "a keyed shard must challenge";
  t->challenge = Receive(**challenge);
  const wire::Challenge* c = t->challenge.message()->body_as_Challenge();
  ASSERT_NE(c, nullptr);
  auto second = peer.Answer(*c, "shard 0");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  t->second = Receive(*second);
}

// `result` failed with kAuthFailed and a message containing `says`.
template <typename T>
void ExpectAuthFailed(const Result<T>& result, const std::string& says) {
  ASSERT_FALSE(result.ok()) << "expected a refusal saying '" << says << "'";
  EXPECT_EQ(result.status().code(), Code::kAuthFailed);
  EXPECT_NE(result.status().message().find(says), std::string::npos)
      << result.status().message();
}

TEST(Handshake, KeyedPeerAndShardAgree) {
  PeerAuth peer(Key("0123456789abcdef-run-key"));
  ShardAuth shard(Key("0123456789abcdef-run-key"));
  Transcript t;
  ASSERT_NO_FATAL_FAILURE(Handshake(peer, shard, 2, &t));
  const wire::Hello& first = HelloOf(t.first);
  ASSERT_NE(first.auth_nonce(), nullptr);
  EXPECT_EQ(first.auth_nonce()->size(), kAuthNonceBytes);
  EXPECT_EQ(first.auth_proof(), nullptr);
  const wire::Hello& second = HelloOf(t.second);
  EXPECT_EQ(second.rank(), 2);
  EXPECT_EQ(second.staleness(), 3);
  ASSERT_NE(second.auth_proof(), nullptr);
  EXPECT_EQ(second.auth_proof()->size(), 32u);  // HMAC-SHA256
  auto accepted = shard.OnHello(second);
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  EXPECT_FALSE(accepted->has_value());
  EXPECT_TRUE(peer.CheckWelcome("shard 0").ok());
}

TEST(Handshake, NoKeyOnEitherSideNeedsNoChallenge) {
  PeerAuth peer(nullptr);
  ShardAuth shard(nullptr);
  Frame hello = Receive(peer.First(Worker(0)));
  EXPECT_EQ(HelloOf(hello).auth_nonce(), nullptr);
  auto accepted = shard.OnHello(HelloOf(hello));
  ASSERT_TRUE(accepted.ok());
  EXPECT_FALSE(accepted->has_value());
  EXPECT_TRUE(peer.CheckWelcome("shard 0").ok());
}

TEST(Handshake, WrongKeyIsRefusedByBothSides) {
  // The peer sees that the shard cannot prove the peer's key...
  PeerAuth peer(Key("the-peers-key-0123456789"));
  ShardAuth shard(Key("the-shards-key-012345678"));
  Frame first = Receive(peer.First(Worker(1)));
  auto challenge = shard.OnHello(HelloOf(first));
  ASSERT_TRUE(challenge.ok() && challenge->has_value());
  Frame c = Receive(**challenge);
  auto answer = peer.Answer(*c.message()->body_as_Challenge(), "shard 1");
  ExpectAuthFailed(answer, "shard 1 could not prove");
  // ...and the shard refuses a proof made with another key, even from a
  // peer that did not check the shard's proof.
  const wire::Hello& h = HelloOf(first);
  HelloFields forged = Worker(1);
  forged.nonce = Text(h.auth_nonce());
  const auto* sn = c.message()->body_as_Challenge()->nonce();
  forged.proof = HelloProof(AuthKey("the-peers-key-0123456789"), Text(sn),
                            forged.nonce, wire::Role::Worker, 1, -1);
  auto refused = shard.OnHello(HelloOf(Receive(MakeHelloFrame(forged))));
  ExpectAuthFailed(refused, "does not match");
}

TEST(Handshake, ReplayedHelloIsRefused) {
  auto key = Key("0123456789abcdef-run-key");
  PeerAuth peer(key);
  ShardAuth first_connection(key);
  Transcript recorded;
  ASSERT_NO_FATAL_FAILURE(Handshake(peer, first_connection, 0, &recorded));
  ASSERT_TRUE(first_connection.OnHello(HelloOf(recorded.second)).ok());

  // The recorded second Hello, sent first on a new connection.
  ShardAuth second_connection(key);
  auto refused = second_connection.OnHello(HelloOf(recorded.second));
  ExpectAuthFailed(refused, "replayed");

  // The whole recording replayed: the new connection's challenge differs,
  // so the recorded proof answers nothing.
  ShardAuth third_connection(key);
  auto challenge = third_connection.OnHello(HelloOf(recorded.first));
  ASSERT_TRUE(challenge.ok() && challenge->has_value());
  Frame fresh = Receive(**challenge);
  const auto* old_nonce =
      recorded.challenge.message()->body_as_Challenge()->nonce();
  const auto* new_nonce = fresh.message()->body_as_Challenge()->nonce();
  ASSERT_EQ(old_nonce->size(), new_nonce->size());
  EXPECT_NE(
      std::memcmp(old_nonce->data(), new_nonce->data(), new_nonce->size()), 0);
  refused = third_connection.OnHello(HelloOf(recorded.second));
  ExpectAuthFailed(refused, "replayed Hello");
}

TEST(Handshake, AlteredRankInTheProvenHelloIsRefused) {
  auto key = Key("0123456789abcdef-run-key");
  PeerAuth peer(key);
  ShardAuth shard(key);
  Transcript t;
  ASSERT_NO_FATAL_FAILURE(Handshake(peer, shard, 1, &t));
  const wire::Hello& h = HelloOf(t.second);
  HelloFields altered = Worker(0);  // claims rank 0 with rank 1's proof
  altered.nonce = Text(h.auth_nonce());
  altered.proof = Text(h.auth_proof());
  auto refused = shard.OnHello(HelloOf(Receive(MakeHelloFrame(altered))));
  ExpectAuthFailed(refused, "does not match");
}

TEST(Handshake, KeyedAndUnkeyedSidesRefuseEachOther) {
  auto key = Key("0123456789abcdef-run-key");
  // A keyed peer at an unkeyed shard.
  PeerAuth keyed_peer(key);
  ShardAuth open_shard(nullptr);
  auto refused =
      open_shard.OnHello(HelloOf(Receive(keyed_peer.First(Worker(0)))));
  ExpectAuthFailed(refused, "without --auth-key-file");
  // The keyed peer also refuses a Welcome that came without a Challenge.
  Status welcome = keyed_peer.CheckWelcome("shard 0 at 10.0.0.1:7070");
  EXPECT_EQ(welcome.code(), Code::kAuthFailed);
  EXPECT_NE(welcome.message().find("shard 0 at 10.0.0.1:7070"),
            std::string::npos);
  // An unkeyed peer at a keyed shard.
  PeerAuth open_peer(nullptr);
  ShardAuth keyed_shard(key);
  refused = keyed_shard.OnHello(HelloOf(Receive(open_peer.First(Worker(0)))));
  ExpectAuthFailed(refused, "requires authentication");
  // ...and, were it challenged, says what it lacks.
  PeerAuth other(key);
  ShardAuth shard(key);
  auto challenge = shard.OnHello(HelloOf(Receive(other.First(Worker(0)))));
  ASSERT_TRUE(challenge.ok() && challenge->has_value());
  Frame c = Receive(**challenge);
  auto answer = open_peer.Answer(*c.message()->body_as_Challenge(), "shard 0");
  ExpectAuthFailed(answer, "--auth-key-file");
}

TEST(Handshake, ProofsCompareInFullOnly) {
  EXPECT_TRUE(SameProof("abc", "abc"));
  EXPECT_FALSE(SameProof("abc", "abd"));
  EXPECT_FALSE(SameProof("abc", "ab"));
  EXPECT_FALSE(SameProof("", ""));
  // Each part is length-prefixed: moving bytes between parts changes the MAC.
  AuthKey key("0123456789abcdef-run-key");
  EXPECT_NE(key.Mac("l", {"ab", "c"}), key.Mac("l", {"a", "bc"}));
  EXPECT_EQ(key.Mac("l", {"ab", "c"}), key.Mac("l", {"ab", "c"}));
  EXPECT_NE(key.Mac("l", {"ab", "c"}),
            AuthKey("0123456789abcdef-other").Mac("l", {"ab", "c"}));
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(AuthKeyFile, ErrorsNameTheFlagAndTheFile) {
  TempDir dir;
  auto missing = AuthKey::Load(dir.path() + "/nope", "--auth-key-file");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--auth-key-file " + dir.path() +
                                            "/nope"),
            std::string::npos);
  Write(dir.path() + "/short", "tooshort\n");
  auto short_key = AuthKey::Load(dir.path() + "/short", "--auth-key-file");
  ASSERT_FALSE(short_key.ok());
  EXPECT_NE(short_key.status().message().find("8 bytes"), std::string::npos);
  EXPECT_NE(short_key.status().message().find("at least 16"),
            std::string::npos);
  // A trailing newline (echo, an editor) is not part of the key.
  Write(dir.path() + "/a", "0123456789abcdef-run-key\n");
  Write(dir.path() + "/b", "0123456789abcdef-run-key");
  auto a = AuthKey::Load(dir.path() + "/a", "--auth-key-file");
  auto b = AuthKey::Load(dir.path() + "/b", "--auth-key-file");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->Mac("x", {}), (*b)->Mac("x", {}));
}

TEST(DashboardToken, CreatedOnceWithMode600ThenReadBack) {
  TempDir dir;
  const std::string path = dir.path() + "/dashboard.token";
  auto made = LoadOrCreateToken(path, "--http-token-file");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(made->size(), 64u);
  EXPECT_EQ(made->find_first_not_of("0123456789abcdef"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = LoadOrCreateToken(path, "--http-token-file");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *made);
  auto other =
      LoadOrCreateToken(dir.path() + "/other.token", "--http-token-file");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *made);
  auto nowhere =
      LoadOrCreateToken(dir.path() + "/no/such/dir/t", "--http-token-file");
  ASSERT_FALSE(nowhere.ok());
  EXPECT_NE(nowhere.status().message().find("--http-token-file " + dir.path() +
                                            "/no/such/dir/t"),
            std::string::npos);
}

}  // namespace
}  // namespace tether
