// tether-ckpt against a real two-shard checkpoint written by
// CheckpointStore; the exported files are read back by a plain Python
// reader (standard library only), so the format is checked by an
// independent parser, not by our own.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "server/checkpoint.h"
#include "server/initializer.h"
#include "server/param_store.h"
#include "tests/support/raw_checkpoint_db.h"
#include "tests/support/temp_dir.h"
#include "tools/process.h"

#ifndef TETHER_CKPT_BIN
#error "TETHER_CKPT_BIN must name the tether-ckpt binary"
#endif

namespace tether {
namespace {

constexpr uint64_t kSeed = 7;
constexpr uint64_t kBigKey = (uint64_t{1} << 63) + 5;
const InitSpec kBiasInit = {.kind = InitSpec::Kind::kUniform, .scale = 0.5f};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

using ::tether::testing::RawCheckpointDb;
using ::tether::testing::TempDir;

struct RunResult {
  int code = -1;
  std::string output;
};

RunResult RunTool(std::vector<std::string> argv, const std::string& log) {
  RunResult r;
  Result<std::unique_ptr<Process>> p = Process::Start(std::move(argv), log);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return r;
  Result<int> code = (*p)->Wait(20000);
  EXPECT_TRUE(code.ok()) << code.status().ToString();
  r.code = code.ok() ? *code : -1;
  r.output = (*p)->Log();
  return r;
}

// --- The checkpoint
// --------------------------------------------------------------
//
// Block size 4, momentum (one slot per weight), two shards:
//   w     [2, 5]: blocks 0 and 2 on shard 0, block 1 on shard 1
//   bias  [6]:    block 0 on shard 1; block 1 never touched (initial values)
//   emb   dim 2:  rows 7 and 2^63+5 on shard 0, row 3 on shard 1

const std::vector<float> kW = {0.1f,   -0.2f, 1e-3f, 3.5f,   -7.25f,
                               1e-30f, 2.0f,  -0.0f, 123.5f, 0.3f};
const std::vector<float> kBias0 = {0.5f, 0.25f, -0.125f, 9.0f};
const std::map<uint64_t, std::vector<float>> kRows = {
    {3, {1.5f, -2.5f}}, {7, {0.7f, 0.07f}}, {kBigKey, {-1e10f, 42.0f}}};

RunSettings Settings() {
  RunSettings s;
  s.seed = kSeed;
  s.num_shards = 2;
  s.num_workers = 2;
  s.block_size = 4;
  s.checkpoint_every = 10;
  s.optimizer.kind = OptimizerKind::kMomentum;
  return s;
}

TensorSnapshot::Block Block(uint32_t index, const std::vector<float>& all) {
  const size_t begin = size_t{index} * 4;
  std::vector<float> w(all.begin() + begin,
                       all.begin() + std::min(all.size(), begin + 4));
  TensorSnapshot::Block b;
  b.index = index;
  b.step = 3;
  b.slots.assign(w.size(), 0.01f);
  b.weights = std::move(w);
  return b;
}

TableSnapshot::Row Row(uint64_t key) {
  return {key, 1, kRows.at(key), std::vector<float>(2, 0.5f)};
}

ShardSnapshot Slice(int64_t round, int shard) {
  ShardSnapshot s;
  s.round = round;
  s.shard_id = shard;
  s.min_clock = round * 10;
  s.worker_clocks = {round * 10, round * 10 + 1};
  s.settings = Settings();
  TensorSnapshot w;
  w.id = NameId("w");
  w.name = "w";
  w.shape = {2, 5};
  w.init = {.kind = InitSpec::Kind::kNormal, .scale = 0.1f};
  TensorSnapshot bias;
  bias.id = NameId("bias");
  bias.name = "bias";
  bias.shape = {6};
  bias.init = kBiasInit;
  TableSnapshot emb;
  emb.id = NameId("emb");
  emb.name = "emb";
  emb.dim = 2;
  if (shard == 0) {
    w.blocks = {Block(0, kW), Block(2, kW)};
    emb.rows = {Row(7), Row(kBigKey)};
  } else {
    w.blocks = {Block(1, kW)};
    bias.blocks = {Block(0, kBias0)};
    emb.rows = {Row(3)};
  }
  s.tensors = {w, bias};
  s.tables = {emb};
  return s;
}

RoundRecord Record(int64_t round) {
  RoundRecord r;
  r.round = round;
  r.clock = round * 10;
  r.unix_ms = 1700000000000;
  r.bytes = 4096;
  r.settings = Settings();
  r.workers = {{0, round * 10, 1, 640}, {1, round * 10 + 1, 2, 1280}};
  return r;
}

// Writes rounds 2 and 5 into dir/shard0 and dir/shard1.
void WriteCheckpoint(const std::string& dir) {
  for (int shard = 0; shard < 2; ++shard) {
    Result<std::unique_ptr<CheckpointStore>> store =
        CheckpointStore::Open(dir + "/shard" + std::to_string(shard));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (int64_t round : {2, 5}) {
      Result<uint64_t> bytes = (*store)->WriteShard(Slice(round, shard));
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      if (shard == 0) {
        ASSERT_TRUE((*store)->MarkComplete(Record(round)).ok());
      }
    }
  }
}

// --- Reading the exports back
// -------------------------------------------------

struct Array {
  std::string dtype;
  std::string shape;  // "2x5"
  std::vector<std::string> values;
};

// Lines "array NAME DTYPE SHAPE V V ..." from the Python readers.
std::map<std::string, Array> ParseArrays(const std::string& output) {
  std::map<std::string, Array> arrays;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string tag, name;
    Array a;
    if (!(words >> tag >> name >> a.dtype >> a.shape) || tag != "array") {
      continue;
    }
    for (std::string v; words >> v;) a.values.push_back(v);
    arrays[name] = a;
  }
  return arrays;
}

// Python prints each float32 widened to a double, shortest round-trip form:
// parsing it back and narrowing gives the same bits exactly.
std::vector<uint32_t> FloatBits(const std::vector<std::string>& values) {
  std::vector<uint32_t> bits;
  for (const std::string& v : values) {
    const float f = static_cast<float>(std::strtod(v.c_str(), nullptr));
    uint32_t b;
    std::memcpy(&b, &f, 4);
    bits.push_back(b);
  }
  return bits;
}

std::vector<uint32_t> FloatBits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * 4);
  return bits;
}

constexpr const char* kSafetensorsReader = R"(
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
end_all = 0
for name in sorted(header):
    e = header[name]
    if name == '__metadata__':
        print('meta', ' '.join(k + '=' + e[k] for k in sorted(e)))
        continue
    b, end = e['data_offsets']
    end_all = max(end_all, end)
    code = {'F32': 'f', 'U64': 'Q'}[e['dtype']]
    count = (end - b) // struct.calcsize(code)
    values = struct.unpack('<%d%s' % (count, code), data[b:end])
    print('array', name, e['dtype'], 'x'.join(map(str, e['shape'])),
          ' '.join(repr(v) for v in values))
print('layout', n % 8, len(data) - end_all)
)";

constexpr const char* kNpyReader = R"(
import ast, os, struct, sys
for f in sorted(os.listdir(sys.argv[1])):
    raw = open(os.path.join(sys.argv[1], f), 'rb').read()
    assert raw[:8] == b'\x93NUMPY\x01\x00', f
    n = struct.unpack('<H', raw[8:10])[0]
    assert (10 + n) % 64 == 0 and raw[10 + n - 1:10 + n] == b'\n', f
    h = ast.literal_eval(raw[10:10 + n].decode('latin1'))
    assert h['fortran_order'] is False, f
    code = {'<f4': 'f', '<u8': 'Q'}[h['descr']]
    data = raw[10 + n:]
    count = len(data) // struct.calcsize(code)
    values = struct.unpack('<%d%s' % (count, code), data)
    print('array', f[:-4], h['descr'], 'x'.join(map(str, h['shape'])),
          ' '.join(repr(v) for v in values))
)";

void ExpectModel(const std::map<std::string, Array>& arrays,
                 const std::string& f32, const std::string& u64) {
  ASSERT_EQ(arrays.size(), 4u);
  const Array& w = arrays.at("w");
  EXPECT_EQ(w.dtype, f32);
  EXPECT_EQ(w.shape, "2x5");
  EXPECT_EQ(FloatBits(w.values), FloatBits(kW));

  // Block 1 of bias was never touched: the run's initial values.
  std::vector<float> bias = kBias0;
  bias.resize(6);
  FillInitial(kBiasInit, kSeed, NameId("bias"), 4, {bias.data() + 4, 2});
  const Array& b = arrays.at("bias");
  EXPECT_EQ(b.shape, "6");
  EXPECT_EQ(FloatBits(b.values), FloatBits(bias));

  const Array& keys = arrays.at("emb.keys");
  EXPECT_EQ(keys.dtype, u64);
  EXPECT_EQ(keys.shape, "3");
  EXPECT_EQ(keys.values,
            (std::vector<std::string>{"3", "7", std::to_string(kBigKey)}));
  const Array& values = arrays.at("emb.values");
  EXPECT_EQ(values.dtype, f32);
  EXPECT_EQ(values.shape, "3x2");
  std::vector<float> rows;
  for (const auto& [key, row] : kRows)
    rows.insert(rows.end(), row.begin(), row.end());
  EXPECT_EQ(FloatBits(values.values), FloatBits(rows));
}

// Replaces shard `dir`'s value for w's block 1 in `round` by 12 bytes: what
// a damaged file would decode to. Knows the layout in server/checkpoint.cc.
void CorruptBlock(const std::string& dir, int64_t round) {
  RawCheckpointDb raw(dir, /*read_only=*/false);
  ASSERT_TRUE(raw.status().ok()) << raw.status().ToString();
  EXPECT_TRUE(raw.PutBlock(round, "w", 1, std::string(12, 'x')).ok());
}

TEST(CkptTool, ListShowVerifyExport) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(dir.path()));
  const std::string log = dir.path() + "/out.log";
  const std::string shards = dir.path() + "/shard0," + dir.path() + "/shard1";

  RunResult list =
      RunTool({TETHER_CKPT_BIN, "list", "--data-dir", shards}, log);
  EXPECT_EQ(list.code, 0) << list.output;
  EXPECT_TRUE(Contains(
      list.output, "2       20        2023-11-14T22:13:20Z  4096          2"))
      << list.output;
  EXPECT_TRUE(Contains(list.output, "5       50")) << list.output;

  // The parent dir of shard0, shard1 works as well as the list.
  RunResult show = RunTool(
      {TETHER_CKPT_BIN, "show", "--data-dir", dir.path(), "--round", "latest"},
      log);
  EXPECT_EQ(show.code, 0) << show.output;
  for (const char* part :
       {"round 5: clock 50", "seed 7, 2 shards, 2 workers",
        "block size 4, checkpoint every 10 clocks", "optimizer: momentum",
        "w  [2, 5]  normal(0.1)  blocks 3/3 held",
        "bias  [6]  uniform(0.5)  blocks 1/2 held", "emb  dim 2  zeros  rows 3",
        "max 123.5", "rank 1: clock 51, epoch 2, samples 1280"}) {
    EXPECT_TRUE(Contains(show.output, part)) << part << "\n" << show.output;
  }

  RunResult verify = RunTool(
      {TETHER_CKPT_BIN, "verify", "--data-dir", shards, "--round", "2"}, log);
  EXPECT_EQ(verify.code, 0) << verify.output;
  EXPECT_TRUE(Contains(verify.output,
                       "round 2: OK (2 shards, 2 tensors, 4 "
                       "blocks, 1 tables, 3 rows)"))
      << verify.output;
  EXPECT_TRUE(Contains(verify.output, "'bias': 1 of 2 blocks were never"))
      << verify.output;

  const std::string file = dir.path() + "/model.safetensors";
  RunResult st = RunTool({TETHER_CKPT_BIN, "export", "--data-dir", shards,
                          "--format", "safetensors", "--out", file},
                         log);
  ASSERT_EQ(st.code, 0) << st.output;
  RunResult py =
      RunTool({"/usr/bin/python3", "-c", kSafetensorsReader, file}, log);
  ASSERT_EQ(py.code, 0) << py.output;
  EXPECT_TRUE(Contains(py.output, "meta clock=50 round=5 seed=7\n"))
      << py.output;
  // Header padded to 8 bytes; no bytes after the last array.
  EXPECT_TRUE(Contains(py.output, "layout 0 0\n")) << py.output;
  ExpectModel(ParseArrays(py.output), "F32", "U64");

  const std::string npy_dir = dir.path() + "/npy";
  RunResult npy = RunTool({TETHER_CKPT_BIN, "export", "--data-dir", shards,
                           "--round", "5", "--format", "npy", "--out", npy_dir},
                          log);
  ASSERT_EQ(npy.code, 0) << npy.output;
  py = RunTool({"/usr/bin/python3", "-c", kNpyReader, npy_dir}, log);
  ASSERT_EQ(py.code, 0) << py.output;
  ExpectModel(ParseArrays(py.output), "<f4", "<u8");
}

TEST(CkptTool, VerifyNamesRoundAndShardOfDamage) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(dir.path()));
  const std::string log = dir.path() + "/out.log";
  const std::string shard1 = dir.path() + "/shard1";
  const std::string shards = dir.path() + "/shard0," + shard1;

  CorruptBlock(shard1, 5);
  RunResult corrupt =
      RunTool({TETHER_CKPT_BIN, "verify", "--data-dir", shards}, log);
  EXPECT_EQ(corrupt.code, 1) << corrupt.output;
  EXPECT_TRUE(Contains(corrupt.output, "round 5: shard 1 (" + shard1 + ")"))
      << corrupt.output;
  EXPECT_TRUE(Contains(corrupt.output, "corrupt: tensor 'w' block 1"))
      << corrupt.output;
  // Round 2 is untouched and still verifies; export of round 5 refuses.
  EXPECT_EQ(
      RunTool({TETHER_CKPT_BIN, "verify", "--data-dir", shards, "--round", "2"},
              log)
          .code,
      0);
  RunResult export_bad =
      RunTool({TETHER_CKPT_BIN, "export", "--data-dir", shards, "--out",
               dir.path() + "/x.safetensors"},
              log);
  EXPECT_EQ(export_bad.code, 1) << export_bad.output;
  EXPECT_TRUE(Contains(export_bad.output, "round 5")) << export_bad.output;

  std::filesystem::remove_all(shard1);
  RunResult missing = RunTool(
      {TETHER_CKPT_BIN, "verify", "--data-dir", shards, "--round", "2"}, log);
  EXPECT_EQ(missing.code, 1) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "round 2: shard 1 (" + shard1 + ")"))
      << missing.output;
  // Given as the parent dir, the missing shard is named all the same.
  missing = RunTool({TETHER_CKPT_BIN, "verify", "--data-dir", dir.path()}, log);
  EXPECT_EQ(missing.code, 1) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "round 5: shard 1 (" + shard1 + ")"))
      << missing.output;
}

TEST(CkptTool, BadUsageExitsTwo) {
  TempDir dir;
  const std::string log = dir.path() + "/out.log";
  EXPECT_EQ(
      RunTool({TETHER_CKPT_BIN, "frobnicate", "--data-dir", dir.path()}, log)
          .code,
      2);
  EXPECT_EQ(RunTool({TETHER_CKPT_BIN, "list", "--no-such-flag"}, log).code, 2);
  RunResult none = RunTool(
      {TETHER_CKPT_BIN, "list", "--data-dir", dir.path() + "/none"}, log);
  EXPECT_EQ(none.code, 1);
  EXPECT_TRUE(Contains(none.output, dir.path() + "/none: no such directory"))
      << none.output;
  EXPECT_FALSE(Contains(none.output, "CURRENT")) << none.output;
  // A bad flag is exit 2: export without --out, or with an unknown format.
  RunResult no_out =
      RunTool({TETHER_CKPT_BIN, "export", "--data-dir", dir.path()}, log);
  EXPECT_EQ(no_out.code, 2) << no_out.output;
  EXPECT_TRUE(Contains(no_out.output, "export needs --out")) << no_out.output;
  EXPECT_EQ(RunTool({TETHER_CKPT_BIN, "export", "--data-dir", dir.path(),
                     "--out", dir.path() + "/x", "--format", "csv"},
                    log)
                .code,
            2);
  // The dirs given twice.
  EXPECT_EQ(
      RunTool({TETHER_CKPT_BIN, "list", dir.path(), "--data-dir", dir.path()},
              log)
          .code,
      2);
  // --help (and -h) lists every command, now included.
  RunResult help = RunTool({TETHER_CKPT_BIN, "-h"}, log);
  EXPECT_EQ(help.code, 0) << help.output;
  for (const char* command : {"list", "show", "verify", "export", "now"}) {
    EXPECT_TRUE(Contains(help.output, std::string("  ") + command + " "))
        << command << "\n"
        << help.output;
  }
}

TEST(CkptTool, PositionalDirAndShardDirsInTheWrongOrder) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(dir.path()));
  const std::string log = dir.path() + "/out.log";
  // What people type: the dir after the command.
  RunResult list = RunTool({TETHER_CKPT_BIN, "list", dir.path()}, log);
  EXPECT_EQ(list.code, 0) << list.output;
  EXPECT_TRUE(Contains(list.output, "5       50")) << list.output;
  // Shard 1's dir first: said so, not "no complete rounds" and exit 0.
  const std::string swapped = dir.path() + "/shard1," + dir.path() + "/shard0";
  for (const char* command : {"list", "show"}) {
    RunResult r =
        RunTool({TETHER_CKPT_BIN, command, "--data-dir", swapped}, log);
    EXPECT_EQ(r.code, 1) << command << ": " << r.output;
    EXPECT_TRUE(
        Contains(r.output, "holds shard 1's checkpoints, not shard 0's"))
        << command << ": " << r.output;
  }
}

}  // namespace
}  // namespace tether
