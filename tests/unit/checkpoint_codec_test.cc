// The checkpoint store's keys and JSON values, without RocksDB: the key
// layout stays what stores on disk hold, and every value round-trips or is
// refused naming the field.
#include "server/checkpoint_codec.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/checkpoint_keys.h"

namespace tether::checkpoint {
namespace {

namespace json = boost::json;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string HexOf(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return hex;
}

// --- Keys --------------------------------------------------------------------

TEST(CheckpointKeys, LayoutIsTheOneOnDisk) {
  EXPECT_EQ(HexOf(RoundKey(7)), "0000000000000007");
  EXPECT_EQ(HexOf(BlockKey(7, 0x01020304, 9)),
            "0000000000000007"
            "62"
            "01020304"
            "00000009");
  EXPECT_EQ(HexOf(RowKey(1, 2, 0x1122334455667788)),
            "0000000000000001"
            "72"
            "00000002"
            "1122334455667788");
  EXPECT_EQ(HexOf(MetaKey(kMarkerTag, 258)), "6d0000000000000102");
  EXPECT_EQ(RecordKey(42), "round/00000000000000000042");
}

TEST(CheckpointKeys, KeysSortByRound) {
  EXPECT_LT(RoundKey(255), RoundKey(256));
  EXPECT_LT(BlockKey(1, 0xffffffff, 0xffffffff), RoundKey(2));
  EXPECT_LT(RowKey(1, 0xffffffff, ~uint64_t{0}), RoundKey(2));
  EXPECT_LT(MetaKey(kHeaderTag, 9), MetaKey(kHeaderTag, 10));
  EXPECT_LT(RecordKey(9), RecordKey(10));
  EXPECT_LT(RecordKey(kMaxRound), RecordKey(kMaxRound + 1));
}

TEST(CheckpointKeys, DataKeysParseBack) {
  std::optional<DataKey> block = ParseDataKey(BlockKey(7, 3, 0xfffffffe));
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->round, 7);
  EXPECT_EQ(block->kind, kBlockKind);
  EXPECT_EQ(block->id, 3u);
  EXPECT_EQ(block->index, 0xfffffffeu);

  std::optional<DataKey> row = ParseDataKey(RowKey(kMaxRound, 5, ~uint64_t{0}));
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->round, kMaxRound);
  EXPECT_EQ(row->kind, kRowKind);
  EXPECT_EQ(row->id, 5u);
  EXPECT_EQ(row->index, ~uint64_t{0});
}

TEST(CheckpointKeys, OtherKeysAreNotDataKeys) {
  const std::string block = BlockKey(7, 3, 4);
  const std::string row = RowKey(7, 3, 4);
  EXPECT_FALSE(ParseDataKey(""));
  EXPECT_FALSE(ParseDataKey(RoundKey(7)));
  EXPECT_FALSE(ParseDataKey(block.substr(0, block.size() - 1)));
  EXPECT_FALSE(ParseDataKey(block + '\0'));
  EXPECT_FALSE(ParseDataKey(row.substr(0, row.size() - 1)));
  std::string wrong_kind = block;
  wrong_kind[8] = kRowKind;  // a row kind on a block-sized key
  EXPECT_FALSE(ParseDataKey(wrong_kind));
  wrong_kind[8] = 'x';
  EXPECT_FALSE(ParseDataKey(wrong_kind));
}

TEST(CheckpointKeys, MetaKeysParseBackForTheirTagOnly) {
  EXPECT_EQ(ParseMetaKey(kMarkerTag, MetaKey(kMarkerTag, 12345)), 12345);
  EXPECT_EQ(ParseMetaKey(kHeaderTag, MetaKey(kHeaderTag, kMaxRound)),
            kMaxRound);
  EXPECT_FALSE(ParseMetaKey(kHeaderTag, MetaKey(kMarkerTag, 1)));
  EXPECT_FALSE(ParseMetaKey(kMarkerTag, MetaKey(kMarkerTag, 1) + "x"));
  EXPECT_FALSE(ParseMetaKey(kMarkerTag, std::string(1, kMarkerTag)));
}

// --- Settings ----------------------------------------------------------------

// Every field away from its default, so a field the codec drops shows.
RunSettings Unusual(OptimizerKind kind) {
  RunSettings s;
  s.run_id = "6f1c0d2e9a8b7c6d5e4f3a2b1c0d9e8f";
  s.seed = 0xfedcba9876543210;
  s.num_shards = 5;
  s.num_workers = 17;
  s.max_staleness = 4;
  s.reject_staleness = 9;
  s.block_size = 1000;
  s.checkpoint_every = 250;
  s.resume_round = 1500;
  s.keep_checkpoints = 7;
  s.optimizer.kind = kind;
  s.optimizer.lr = 0.125f;
  s.optimizer.momentum = 0.75f;
  s.optimizer.beta1 = 0.5f;
  s.optimizer.beta2 = 0.9921875f;
  s.optimizer.epsilon = 1e-7f;
  s.worker_timeout_ms = 2345;
  s.heartbeat_ms = 321;
  s.backup_workers = 2;
  s.staleness_lr = true;
  return s;
}

void ExpectSameSettings(const RunSettings& a, const RunSettings& b) {
  EXPECT_EQ(a.run_id, b.run_id);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.num_shards, b.num_shards);
  EXPECT_EQ(a.num_workers, b.num_workers);
  EXPECT_EQ(a.max_staleness, b.max_staleness);
  EXPECT_EQ(a.reject_staleness, b.reject_staleness);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.checkpoint_every, b.checkpoint_every);
  EXPECT_EQ(a.resume_round, b.resume_round);
  EXPECT_EQ(a.keep_checkpoints, b.keep_checkpoints);
  EXPECT_EQ(a.optimizer.kind, b.optimizer.kind);
  EXPECT_EQ(a.optimizer.lr, b.optimizer.lr);
  EXPECT_EQ(a.optimizer.momentum, b.optimizer.momentum);
  EXPECT_EQ(a.optimizer.beta1, b.optimizer.beta1);
  EXPECT_EQ(a.optimizer.beta2, b.optimizer.beta2);
  EXPECT_EQ(a.optimizer.epsilon, b.optimizer.epsilon);
  EXPECT_EQ(a.worker_timeout_ms, b.worker_timeout_ms);
  EXPECT_EQ(a.heartbeat_ms, b.heartbeat_ms);
  EXPECT_EQ(a.backup_workers, b.backup_workers);
  EXPECT_EQ(a.staleness_lr, b.staleness_lr);
}

TEST(CheckpointCodec, SettingsRoundTripEveryField) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdaGrad, OptimizerKind::kAdam}) {
    const RunSettings s = Unusual(kind);
    // Through text, as the store keeps it.
    const json::value v = json::parse(json::serialize(SettingsToJson(s)));
    Result<RunSettings> back = SettingsFromJson(v);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameSettings(*back, s);
  }
  // Extremes of the integer fields survive too.
  RunSettings s = Unusual(OptimizerKind::kAdam);
  s.seed = ~uint64_t{0};
  s.max_staleness = -1;
  s.reject_staleness = -1;
  s.resume_round = -1;
  s.checkpoint_every = int64_t{1} << 62;
  s.block_size = ~uint32_t{0};
  s.run_id = "";
  Result<RunSettings> back = SettingsFromJson(SettingsToJson(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameSettings(*back, s);
}

TEST(CheckpointCodec, SettingsOfOlderRoundsKeepDefaultsForNewerFields) {
  json::object v = SettingsToJson(Unusual(OptimizerKind::kSgd)).as_object();
  for (const char* newer : {"run_id", "keep_checkpoints", "worker_timeout_ms",
                            "heartbeat_ms", "backup_workers", "staleness_lr"}) {
    v.erase(newer);
  }
  Result<RunSettings> back = SettingsFromJson(v);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const RunSettings defaults;
  EXPECT_EQ(back->run_id, "");
  EXPECT_EQ(back->keep_checkpoints, defaults.keep_checkpoints);
  EXPECT_EQ(back->worker_timeout_ms, defaults.worker_timeout_ms);
  EXPECT_EQ(back->heartbeat_ms, defaults.heartbeat_ms);
  EXPECT_EQ(back->backup_workers, defaults.backup_workers);
  EXPECT_EQ(back->staleness_lr, defaults.staleness_lr);
  EXPECT_EQ(back->num_workers, 17);
}

// The refusal of `v`, which must be one.
Status Refusal(const json::value& v) {
  Result<RunSettings> s = SettingsFromJson(v);
  EXPECT_FALSE(s.ok());
  return s.ok() ? Status::Ok() : s.status();
}

TEST(CheckpointCodec, SettingsOfTheWrongTypeAreRefusedNamingTheField) {
  const json::object good =
      SettingsToJson(Unusual(OptimizerKind::kAdam)).as_object();
  for (const auto& field : good) {
    const std::string key(field.key());
    if (key == "optimizer") continue;
    json::object bad = good;
    // A string where a number or bool belongs; a number for run_id.
    bad[key] = key == "run_id" ? json::value(12) : json::value("x");
    const Status s = Refusal(bad);
    EXPECT_EQ(s.code(), Code::kCorruption) << key;
    EXPECT_TRUE(Contains(s.message(), "settings field '" + key + "'"))
        << s.message();
  }
  for (const auto& field : good.at("optimizer").as_object()) {
    const std::string key(field.key());
    json::object bad = good;
    bad["optimizer"].as_object()[key] =
        key == "kind" ? json::value(1) : json::value("x");
    const Status s = Refusal(bad);
    EXPECT_EQ(s.code(), Code::kCorruption) << key;
    EXPECT_TRUE(Contains(s.message(), "settings optimizer field '" + key + "'"))
        << s.message();
  }
}

TEST(CheckpointCodec, SettingsMissingOrOutOfRangeAreRefusedNamingTheField) {
  const json::object good =
      SettingsToJson(Unusual(OptimizerKind::kAdam)).as_object();
  for (const char* required :
       {"seed", "num_shards", "num_workers", "max_staleness",
        "reject_staleness", "block_size", "checkpoint_every", "resume_round",
        "optimizer"}) {
    json::object bad = good;
    bad.erase(required);
    const Status s = Refusal(bad);
    EXPECT_EQ(s.code(), Code::kCorruption);
    EXPECT_EQ(s.message(),
              std::string("settings has no field '") + required + "'");
  }
  json::object bad = good;
  bad["num_workers"] = int64_t{1} << 40;
  EXPECT_EQ(Refusal(bad).message(),
            "settings field 'num_workers' is not a number in range");
  bad = good;
  bad["block_size"] = -1;
  EXPECT_EQ(Refusal(bad).message(),
            "settings field 'block_size' is not a number in range");
  bad = good;
  bad["num_shards"] = 0;
  EXPECT_EQ(Refusal(bad).message(),
            "settings has num_shards or block_size below 1");
  bad = good;
  bad["optimizer"].as_object()["kind"] = "lion";
  EXPECT_EQ(Refusal(bad).message(),
            "settings optimizer kind 'lion' is unknown");
  EXPECT_EQ(Refusal(json::array{}).message(), "settings is not a JSON object");
}

// --- Headers, markers, records -----------------------------------------------

ShardSnapshot Snapshot() {
  ShardSnapshot s;
  s.round = 40;
  s.shard_id = 1;
  s.min_clock = 40;
  s.worker_clocks = {40, 41, 43};
  s.settings = Unusual(OptimizerKind::kAdam);
  TensorSnapshot& t = s.tensors.emplace_back();
  t.id = 11;
  t.name = "fc1.weight";
  t.shape = {256, 784};
  t.init = {InitSpec::Kind::kUniform, 0.0625f};
  t.blocks.resize(3);
  TensorSnapshot& u = s.tensors.emplace_back();
  u.id = 12;
  u.name = "fc1.bias";
  u.shape = {256};
  u.init = {InitSpec::Kind::kProvided, 0.0f};
  TableSnapshot& table = s.tables.emplace_back();
  table.id = 20;
  table.name = "emb";
  table.dim = 8;
  table.init = {InitSpec::Kind::kNormal, 0.01f};
  table.rows.resize(5);
  return s;
}

TEST(CheckpointCodec, HeaderRoundTripsDefinitionsAndCounts) {
  const ShardSnapshot s = Snapshot();
  Result<ShardHeader> h = HeaderFromJson(HeaderToJson(s));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const ShardSnapshot& back = h->snapshot;
  EXPECT_EQ(back.round, 40);
  EXPECT_EQ(back.shard_id, 1);
  EXPECT_EQ(back.min_clock, 40);
  EXPECT_EQ(back.worker_clocks, s.worker_clocks);
  ExpectSameSettings(back.settings, s.settings);
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[0].id, 11u);
  EXPECT_EQ(back.tensors[0].name, "fc1.weight");
  EXPECT_EQ(back.tensors[0].shape, (std::vector<uint64_t>{256, 784}));
  EXPECT_EQ(back.tensors[0].init.kind, InitSpec::Kind::kUniform);
  EXPECT_EQ(back.tensors[0].init.scale, 0.0625f);
  EXPECT_TRUE(back.tensors[0].blocks.empty());  // definitions only
  EXPECT_EQ(back.tensors[1].init.kind, InitSpec::Kind::kProvided);
  ASSERT_EQ(back.tables.size(), 1u);
  EXPECT_EQ(back.tables[0].name, "emb");
  EXPECT_EQ(back.tables[0].dim, 8u);
  EXPECT_EQ(back.tables[0].init.kind, InitSpec::Kind::kNormal);
  EXPECT_EQ(back.tables[0].init.scale, 0.01f);
  EXPECT_TRUE(back.tables[0].rows.empty());
  EXPECT_EQ(h->blocks, (std::map<uint32_t, uint64_t>{{11, 3}, {12, 0}}));
  EXPECT_EQ(h->rows, (std::map<uint32_t, uint64_t>{{20, 5}}));
}

// The header of Snapshot() with `edit` applied, as text.
template <typename Edit>
std::string EditedHeader(Edit edit) {
  json::value v = json::parse(HeaderToJson(Snapshot()));
  edit(v.as_object());
  return json::serialize(v);
}

std::string HeaderRefusal(const std::string& text) {
  Result<ShardHeader> h = HeaderFromJson(text);
  EXPECT_FALSE(h.ok());
  if (h.ok()) return "";
  EXPECT_EQ(h.status().code(), Code::kCorruption);
  return h.status().message();
}

TEST(CheckpointCodec, BadHeadersAreRefusedNamingTheProblem) {
  EXPECT_TRUE(Contains(HeaderRefusal("{\"format\": 1"), "header is not JSON"));
  EXPECT_EQ(HeaderRefusal("[]"), "header is not a JSON object");
  EXPECT_EQ(
      HeaderRefusal(EditedHeader([](json::object& h) { h["format"] = 2; })),
      "header has an unknown format");
  EXPECT_EQ(HeaderRefusal(
                EditedHeader([](json::object& h) { h["min_clock"] = "soon"; })),
            "header field 'min_clock' is not a number in range");
  EXPECT_EQ(HeaderRefusal(EditedHeader([](json::object& h) {
              h["settings"].as_object()["seed"] = -1;
            })),
            "header settings field 'seed' is not a number in range");
  EXPECT_EQ(HeaderRefusal(EditedHeader([](json::object& h) {
              h["worker_clocks"].as_array().push_back("x");
            })),
            "header has a worker clock that is not an integer");
  EXPECT_EQ(HeaderRefusal(EditedHeader([](json::object& h) {
              h["tensors"].as_array()[0].as_object().erase("blocks");
            })),
            "tensor has no field 'blocks'");
  EXPECT_EQ(
      HeaderRefusal(EditedHeader([](json::object& h) {
        h["tensors"].as_array()[1].as_object()["init"].as_object()["kind"] =
            "ones";
      })),
      "tensor init kind 'ones' is unknown");
  EXPECT_EQ(HeaderRefusal(EditedHeader([](json::object& h) {
              h["tensors"].as_array()[1].as_object()["id"] = 11;
            })),
            "header defines tensor id 11 twice");
  EXPECT_EQ(HeaderRefusal(EditedHeader([](json::object& h) {
              h["tables"].as_array()[0].as_object()["dim"] = 0;
            })),
            "table 'emb' has dim 0");
}

TEST(CheckpointCodec, MarkerRoundTripsItsKeyCount) {
  Result<uint64_t> keys = MarkerKeysFromJson(MarkerToJson(1234, 99999));
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, 1234u);
  for (const char* bad : {"", "{", "{\"bytes\": 1}", "{\"keys\": -1}"}) {
    Result<uint64_t> refused = MarkerKeysFromJson(bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), Code::kCorruption);
    EXPECT_TRUE(Contains(refused.status().message(), "marker")) << bad;
  }
  EXPECT_EQ(MarkerKeysFromJson("{\"bytes\": 1}").status().message(),
            "marker has no field 'keys'");
}

TEST(CheckpointCodec, RecordRoundTripsAndBadOnesAreRefused) {
  RoundRecord r;
  r.round = 60;
  r.clock = 61;
  r.unix_ms = 1700000000123;
  r.bytes = uint64_t{1} << 40;
  r.settings = Unusual(OptimizerKind::kMomentum);
  r.workers = {{0, 60, 2, 12800}, {1, 62, 3, 19200}};
  Result<RoundRecord> back = RecordFromJson(RecordToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->round, 60);
  EXPECT_EQ(back->clock, 61);
  EXPECT_EQ(back->unix_ms, 1700000000123);
  EXPECT_EQ(back->bytes, uint64_t{1} << 40);
  ExpectSameSettings(back->settings, r.settings);
  ASSERT_EQ(back->workers.size(), 2u);
  EXPECT_EQ(back->workers[1].rank, 1);
  EXPECT_EQ(back->workers[1].clock, 62);
  EXPECT_EQ(back->workers[1].epoch, 3);
  EXPECT_EQ(back->workers[1].samples, 19200u);

  json::value v = json::parse(RecordToJson(r));
  v.as_object()["workers"].as_array()[1].as_object()["samples"] = "many";
  Result<RoundRecord> refused = RecordFromJson(json::serialize(v));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kCorruption);
  EXPECT_EQ(refused.status().message(),
            "record worker field 'samples' is not a number in range");
  EXPECT_TRUE(Contains(RecordFromJson("nope").status().message(),
                       "record is not JSON"));
}

}  // namespace
}  // namespace tether::checkpoint
