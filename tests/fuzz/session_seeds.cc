// Writes the seed corpus of tests/fuzz/session_fuzz.cc (its input format is
// described there): conversations that reach each message handler.
//   session_seeds DIR
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "schema/auth.h"
#include "schema/frame.h"
#include "schema/stats_frame.h"
#include "schema/wire_values.h"

namespace {

using namespace tether;

class Conversation {
 public:
  explicit Conversation(uint8_t mode) { bytes_.push_back(mode); }
  Conversation& Say(int who, const OutFrame& frame) {
    const std::vector<uint8_t> all = frame->Flatten();
    const size_t n = all.size() - kFrameHeaderBytes;
    bytes_.push_back(static_cast<uint8_t>(who));
    bytes_.push_back(static_cast<uint8_t>(n));
    bytes_.push_back(static_cast<uint8_t>(n >> 8));
    bytes_.insert(bytes_.end(), all.begin() + kFrameHeaderBytes, all.end());
    return *this;
  }
  void Write(const std::string& path) const {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
  }

 private:
  std::vector<uint8_t> bytes_;
};

OutFrame Define(uint64_t id, const char* name, std::vector<uint64_t> shape) {
  flatbuffers::FlatBufferBuilder fbb;
  auto n = fbb.CreateString(name);
  auto init = wire::CreateInitSpec(fbb, wire::InitKind::Constant, 1.0f);
  return FinishFrame(
      fbb, wire::CreateDefineTensor(fbb, id, n, fbb.CreateVector(shape), init));
}

OutFrame DefineTable(uint64_t id, const char* name, uint32_t dim) {
  flatbuffers::FlatBufferBuilder fbb;
  auto n = fbb.CreateString(name);
  auto init = wire::CreateInitSpec(fbb, wire::InitKind::Uniform, 0.1f);
  return FinishFrame(fbb, wire::CreateDefineTable(fbb, id, n, dim, init));
}

OutFrame Pull(uint64_t id, uint32_t tensor, std::vector<uint32_t> blocks,
              std::vector<uint64_t> keys) {
  flatbuffers::FlatBufferBuilder fbb;
  const bool sparse = !keys.empty();
  auto b = fbb.CreateVector(blocks);
  auto k = fbb.CreateVector(keys);
  return FinishFrame(fbb, wire::CreatePull(fbb, id, tensor, b, k, sparse));
}

OutFrame Push(uint64_t id, uint32_t tensor, int64_t read_clock) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<float> values(16, 0.5f);
  std::vector<flatbuffers::Offset<wire::Block>> blocks = {
      wire::CreateBlock(fbb, 0, fbb.CreateVector(values))};
  return FinishFrame(fbb, wire::CreatePush(fbb, id, tensor, read_clock,
                                           fbb.CreateVector(blocks)));
}

OutFrame SparsePush(uint64_t id, uint32_t table) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint64_t> keys = {3, 99};
  std::vector<float> rows(8, 0.25f);
  return FinishFrame(
      fbb, wire::CreatePush(fbb, id, table, -1, 0, fbb.CreateVector(keys),
                            fbb.CreateVector(rows), true));
}

// The id a shard gives tensor `name` (server/param_store.h's NameId).
uint32_t Fnv1a(const std::string& name) {
  uint32_t h = 2166136261u;
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return h;
}

// A provided tensor: defined without values, then given them.
OutFrame DefineProvided(uint64_t id, const char* name,
                        std::vector<uint64_t> shape) {
  flatbuffers::FlatBufferBuilder fbb;
  auto n = fbb.CreateString(name);
  auto init = wire::CreateInitSpec(fbb, wire::InitKind::Provided, 0.0f);
  return FinishFrame(
      fbb, wire::CreateDefineTensor(fbb, id, n, fbb.CreateVector(shape), init));
}

OutFrame Provide(uint64_t id, uint32_t tensor) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<float> values(8, 0.5f);
  std::vector<flatbuffers::Offset<wire::Block>> blocks = {
      wire::CreateBlock(fbb, 0, fbb.CreateVector(values))};
  return FinishFrame(
      fbb, wire::CreatePush(fbb, id, tensor, -1, fbb.CreateVector(blocks), 0, 0,
                            false, /*provide=*/true));
}

// Values narrowed on the wire (bfloat16 or int8): a dense push of block 0
// of `tensor`, a sparse push of two rows of width 4, and pulls asking for
// either.
OutFrame NarrowPush(uint64_t id, uint32_t tensor, WireDtype dtype) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<float> values(16);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * i - 0.7f;
  const uint32_t seed = 7;
  const NarrowedValues v = AddNarrowed(fbb, values, dtype, &seed);
  std::vector<flatbuffers::Offset<wire::Block>> blocks = {
      wire::CreateBlock(fbb, 0, 0, v.bf16, 0, 0, false, v.q8, v.q8_scale)};
  return FinishFrame(
      fbb, wire::CreatePush(fbb, id, tensor, 0, fbb.CreateVector(blocks)));
}

OutFrame NarrowSparsePush(uint64_t id, uint32_t table, WireDtype dtype) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint64_t> keys = {3, 99};
  std::vector<float> rows = {0.25f, -1, 2, 0.5f, 3, 0, -0.125f, 1};
  auto k = fbb.CreateVector(keys);
  const uint32_t seed = 9;
  const NarrowedValues v = AddNarrowed(fbb, rows, dtype, &seed);
  return FinishFrame(fbb, wire::CreatePush(fbb, id, table, -1, 0, k, 0, true,
                                           false, v.bf16, v.q8, v.q8_scale));
}

OutFrame NarrowPull(uint64_t id, uint32_t tensor, std::vector<uint32_t> blocks,
                    std::vector<uint64_t> keys, WireDtype dtype) {
  flatbuffers::FlatBufferBuilder fbb;
  const bool sparse = !keys.empty();
  auto b = fbb.CreateVector(blocks);
  auto k = fbb.CreateVector(keys);
  return FinishFrame(fbb, wire::CreatePull(fbb, id, tensor, b, k, sparse, -1, 0,
                                           ToWire(dtype)));
}

template <typename Make>
OutFrame Build(Make make) {
  flatbuffers::FlatBufferBuilder fbb;
  return FinishFrame(fbb, make(fbb));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: session_seeds DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  auto clock = [](uint64_t id, int64_t c) {
    return Build([&](auto& fbb) { return wire::CreateClock(fbb, id, c); });
  };
  // Two workers train: define, pull, push, clock.
  Conversation(1 | 4)
      .Say(0, Define(1, "w", {4, 8}))
      .Say(1, Define(1, "w", {4, 8}))
      .Say(0, Pull(2, 0, {0, 1}, {}))
      .Say(0, Push(3, 0, 0))
      .Say(0, clock(4, 1))
      .Say(1, Pull(2, 0, {0}, {}))
      .Say(1, clock(3, 1))
      .Say(0, Pull(5, 0, {1}, {}))
      .Write(dir + "/train");
  // A provided tensor: pulled and pushed too early, then provided twice.
  Conversation(1 | 4)
      .Say(0, DefineProvided(1, "p", {8}))
      .Say(1, DefineProvided(1, "p", {8}))
      .Say(1, Pull(2, Fnv1a("p"), {0}, {}))
      .Say(1, Push(3, Fnv1a("p"), 0))
      .Say(0, Provide(2, Fnv1a("p")))
      .Say(1, Provide(4, Fnv1a("p")))
      .Say(1, Pull(5, Fnv1a("p"), {0}, {}))
      .Write(dir + "/provided");
  // Sparse tables.
  Conversation(1 | 4)
      .Say(0, DefineTable(1, "emb", 4))
      .Say(0, Pull(2, 0, {}, {3, 99, 3}))
      .Say(0, SparsePush(3, 0))
      .Write(dir + "/sparse");
  // Narrowed values: bf16 and int8 pushes and pulls, dense and sparse.
  Conversation(1 | 4)
      .Say(0, Define(1, "w", {4, 8}))
      .Say(0, DefineTable(2, "emb", 4))
      .Say(0, NarrowPush(3, Fnv1a("w"), WireDtype::kInt8))
      .Say(0, NarrowPull(4, Fnv1a("w"), {0, 1}, {}, WireDtype::kInt8))
      .Say(0, NarrowPush(5, Fnv1a("w"), WireDtype::kBf16))
      .Say(0, NarrowPull(6, Fnv1a("w"), {1}, {}, WireDtype::kBf16))
      .Say(0, NarrowSparsePush(7, Fnv1a("emb"), WireDtype::kInt8))
      .Say(0, NarrowPull(8, Fnv1a("emb"), {}, {3, 99}, WireDtype::kInt8))
      .Write(dir + "/narrow");
  // A worker's reports, data chunks, a heartbeat, a checkpoint request.
  Conversation(1 | 4)
      .Say(0, Build([](auto& fbb) {
             return wire::CreateWorkerReport(
                 fbb, 1, 3, 0, 640, 0.7f, 100.0f, 0.8f, 0.5f,
                 fbb.CreateString("cpu"), fbb.CreateString("host"), 0.1f);
           }))
      .Say(0, Build([](auto& fbb) {
             return wire::CreateDataRequest(fbb, 2, 60000, 2000, 2);
           }))
      .Say(1, Build([](auto& fbb) {
             return wire::CreateHeartbeat(fbb, 0, 1700000000000);
           }))
      .Say(0,
           Build([](auto& fbb) { return wire::CreateCheckpointNow(fbb, 3); }))
      .Write(dir + "/report");
  // A shard registering, then its round and figures.
  Conversation(3)
      .Say(0, Build([](auto& fbb) {
             return wire::CreateRoundWritten(fbb, 0, 1, 4096,
                                             fbb.CreateString(""), 0.01);
           }))
      .Say(0, MakeStatsFrame(0, ShardStats{}))
      .Say(0, Build([](auto& fbb) {
             std::vector<int64_t> intact = {20, 40};
             return wire::CreateResumeResult(fbb, 60,
                                             fbb.CreateString("corrupt"),
                                             fbb.CreateVector(intact));
           }))
      .Write(dir + "/shard");
  // An observer asks for figures and defines a tensor.
  Conversation(2)
      .Say(0, Build([](auto& fbb) { return wire::CreateStatsRequest(fbb, 1); }))
      .Say(0, Define(2, "w", {4, 8}))
      .Write(dir + "/observer");
  // A keyed shard: a Hello with a nonce is challenged.
  HelloFields hello;
  hello.role = wire::Role::Worker;
  hello.rank = 0;
  hello.nonce = std::string(kAuthNonceBytes, 'n');
  Conversation(8).Say(0, MakeHelloFrame(hello)).Write(dir + "/keyed");
  return 0;
}
