#include "tests/support/raw_peer.h"

#include <random>

namespace tether::testing {

std::vector<uint8_t> Bytes(const OutBuffer& buffer) { return buffer.Flatten(); }

std::vector<uint8_t> HelloFrame(uint32_t version,
                                const std::string& client_name) {
  flatbuffers::FlatBufferBuilder fbb(256 + client_name.size());
  auto name = fbb.CreateString(client_name);
  auto hello = wire::CreateHello(fbb, version, wire::Role::Observer, -1, 0, -1,
                                 0, 0, name);
  return Bytes(*FinishFrame(fbb, hello));
}

std::vector<uint8_t> StatsRequestFrame() {
  flatbuffers::FlatBufferBuilder fbb(64);
  return Bytes(*FinishFrame(fbb, wire::CreateStatsRequest(fbb, 7)));
}

std::vector<uint8_t> Header(uint32_t n) {
  return {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
          static_cast<uint8_t>(n >> 16), static_cast<uint8_t>(n >> 24)};
}

std::vector<uint8_t> GarbageFrame(uint32_t seed, uint32_t body_size) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes = Header(body_size);
  for (uint32_t i = 0; i < body_size; ++i) {
    bytes.push_back(static_cast<uint8_t>(rng() >> 24));
  }
  return bytes;
}

::testing::AssertionResult Contains(const std::string& text,
                                    const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "'" << text << "' does not contain '" << part << "'";
}

Result<ErrorReply> ReadError(RawPeer& peer) {
  auto frame = peer.ReadFrame(kReplyTimeoutMs);
  if (!frame.ok()) return frame.status();
  const wire::Error* error = frame->message()->body_as_Error();
  if (error == nullptr) {
    return ProtocolError(std::string("expected an Error, got ") +
                         wire::EnumNameBody(frame->message()->body_type()));
  }
  return ErrorReply{error->code(),
                    error->message() ? error->message()->str() : ""};
}

void ExpectRefused(const std::string& address, std::span<const uint8_t> bytes,
                   bool shutdown_send, ErrorReply* reply) {
  auto peer = RawPeer::Connect(address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_FALSE((*peer)->Send(bytes));
  if (shutdown_send) (*peer)->ShutdownSend();
  auto error = ReadError(**peer);
  ASSERT_TRUE(error.ok()) << error.status().ToString();
  *reply = *error;
  Status closed = (*peer)->WaitForClose(kReplyTimeoutMs);
  EXPECT_TRUE(closed.ok()) << closed.ToString();
}

void ExpectServing(Client& client, const std::string& name, float lr) {
  constexpr size_t kSize = 64;
  ASSERT_TRUE(
      client.DefineTensor(name, {kSize}, {InitKind::kConstant, 1.0f}).ok());
  std::vector<float> values(kSize, -7.0f);
  Status pulled = client.Pull(name, values);
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  for (float v : values) ASSERT_FLOAT_EQ(v, 1.0f);
  std::vector<float> grad(kSize, 1.0f);
  Status pushed = client.Push(name, grad);
  ASSERT_TRUE(pushed.ok()) << pushed.ToString();
  pulled = client.Pull(name, values);
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  for (float v : values) ASSERT_NEAR(v, 1.0f - lr, 1e-6f);
}

std::pair<uint64_t, uint64_t> ShardTraffic(Client& client) {
  auto stats = client.Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  std::pair<uint64_t, uint64_t> in_out;
  for (const ShardStats& s : stats.ok() ? *stats : std::vector<ShardStats>{}) {
    in_out.first += s.bytes_in;
    in_out.second += s.bytes_out;
  }
  return in_out;
}

void ExpectAllRunning(Cluster& cluster) {
  for (int i = 0; i < cluster.num_shards(); ++i) {
    EXPECT_TRUE(cluster.shard(i).Running()) << "shard " << i << " exited";
  }
}

}  // namespace tether::testing
