// libFuzzer target: the message handlers behind the frame. Each input is a
// conversation of two peers with a fresh shard 0 (tests/fuzz/shard0.h):
//   byte 0: bits 0-1 what peer A says first (0 nothing, 1 a worker's Hello
//           for rank 0, 2 an observer's, 3 shard 1 registering); bit 2 peer
//           B says a worker's Hello for rank 1; bit 3 the shard has a key
//   then records: 1 byte (bit 0: from peer B), 2 bytes little-endian
//           length, that many bytes of frame body.
// Each record that passes verification is delivered to the peer's session,
// as its connection would; one that fails ends the input (the connection
// would close). tests/fuzz/session_seeds.cc writes the seed corpus.
#include <cstdint>
#include <cstring>
#include <memory>

#include "schema/auth.h"
#include "schema/log.h"
#include "server/session.h"
#include "tests/fuzz/shard0.h"

namespace {

using namespace tether;

std::shared_ptr<Session> Peer(fuzz::Shard0& s0,
                              std::shared_ptr<const AuthKey> key) {
  ConnectionOptions options;
  options.max_frame_bytes = size_t{1} << 20;
  return std::make_shared<Session>(tcp::socket(s0.io), options, std::move(key),
                                   s0.shard.get(), s0.coordinator.get(),
                                   &s0.dashboard->monitor());
}

Frame ToFrame(const OutFrame& out) {
  const auto n = static_cast<uint32_t>(out->size() - kFrameHeaderBytes);
  Frame frame(n);
  std::memcpy(frame.body(), out->data() + kFrameHeaderBytes, n);
  return frame;
}

OutFrame OpeningHello(int kind, int worker_rank) {
  HelloFields hello;
  hello.name = "fuzz";
  if (kind == 1) {
    hello.role = wire::Role::Worker;
    hello.rank = worker_rank;
    hello.staleness = 2;
    hello.command = "tether-worker --rank " + std::to_string(worker_rank);
  } else if (kind == 3) {
    hello.role = wire::Role::Shard;
    hello.shard_id = 1;
    hello.address = "127.0.0.1:7071";
    hello.command = "tether-server --shard-id 1";
  }
  return MakeHelloFrame(hello);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Refusals are expected by the thousand; keep the log for real trouble.
  static const bool quiet = [] {
    InitLogging("fuzz", LogLevel::kError);
    return true;
  }();
  (void)quiet;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  ++data;
  --size;
  fuzz::Shard0 s0;
  std::shared_ptr<const AuthKey> key;
  if (mode & 8)
    key = std::make_shared<const AuthKey>("fuzz-run-key-0123456789");
  std::shared_ptr<Session> peers[2] = {Peer(s0, key), Peer(s0, key)};
  if ((mode & 3) != 0) peers[0]->Deliver(ToFrame(OpeningHello(mode & 3, 0)));
  if (mode & 4) peers[1]->Deliver(ToFrame(OpeningHello(1, 1)));
  while (size >= 3) {
    const int who = data[0] & 1;
    const size_t n = data[1] | (size_t{data[2]} << 8);
    data += 3;
    size -= 3;
    if (n > size || n < kMinFrameBodyBytes) break;
    Frame frame(static_cast<uint32_t>(n));
    std::memcpy(frame.body(), data, n);
    data += n;
    size -= n;
    if (!frame.Verify().ok()) break;
    peers[who]->Deliver(std::move(frame));
  }
  for (auto& p : peers) p->Close();
  return 0;
}
