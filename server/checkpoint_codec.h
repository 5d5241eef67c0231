// The JSON values of a shard's checkpoint RocksDB (the layout is described
// at the top of server/checkpoint.cc): a round's header, its completion
// marker, shard 0's round records, and the run settings both carry.
//
// Pure functions, safe from any thread; no RocksDB needed. A value that
// does not decode is refused with kCorruption and a message naming the
// value and field, e.g. "header settings field 'seed' is not a number in
// range"; nothing else is returned on failure.
#pragma once

#include <boost/json/value.hpp>
#include <boost/json/value_from.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "schema/status.h"
#include "server/checkpoint.h"
#include "server/run_settings.h"

namespace tether::checkpoint {

// The version of the header and record formats; a header of another
// version is refused.
constexpr int kFormat = 1;

// Every RunSettings field a round keeps (all but the Welcome-only
// shard_restart), keyed by member name, the optimizer's as an object:
// json::value_from(s) (the tag_invoke below).
boost::json::value SettingsToJson(const RunSettings& s);
// Fields added after the format's first version (those without
// kInFirstRounds in server/settings_fields.h: run_id, keep_checkpoints,
// worker_timeout_ms, ...) keep their defaults when absent; any other
// missing field, a field of the wrong type or out of range, an unknown
// optimizer, or num_shards or block_size below 1 is refused, e.g.
// "settings field 'seed' is not a number in range".
Result<RunSettings> SettingsFromJson(const boost::json::value& v);

// A round's header decoded: the snapshot's definitions (no blocks or rows
// in it) and the number of blocks and rows the shard wrote.
struct ShardHeader {
  ShardSnapshot snapshot;
  std::map<uint32_t, uint64_t> blocks;  // by tensor id
  std::map<uint32_t, uint64_t> rows;    // by table id
};
// `s`'s shard id, clocks, settings and tensor and table definitions, with
// the number of blocks and rows it holds.
std::string HeaderToJson(const ShardSnapshot& s);
// Refuses, besides bad fields, another format, a table of dim 0 and a
// tensor or table id defined twice.
Result<ShardHeader> HeaderFromJson(std::string_view text);

// The "shard complete" marker: the number of keys and bytes written.
std::string MarkerToJson(uint64_t keys, uint64_t bytes);
// The number of keys the marker says the round has.
Result<uint64_t> MarkerKeysFromJson(std::string_view text);

std::string RecordToJson(const RoundRecord& r);
Result<RoundRecord> RecordFromJson(std::string_view text);

}  // namespace tether::checkpoint

namespace tether {

// Boost.JSON's value_from: the settings as a round keeps them
// (checkpoint::SettingsToJson), an optimizer kind by name ("adam").
void tag_invoke(boost::json::value_from_tag, boost::json::value& v,
                const RunSettings& s);
void tag_invoke(boost::json::value_from_tag, boost::json::value& v,
                const OptimizerOptions& o);
void tag_invoke(boost::json::value_from_tag, boost::json::value& v,
                OptimizerKind kind);

}  // namespace tether
