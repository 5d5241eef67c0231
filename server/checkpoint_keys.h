// The keys of a shard's checkpoint RocksDB (the layout is described at the
// top of server/checkpoint.cc). Every key of a round starts with the round
// (u64 big-endian), alone or after a one-byte tag, so a round -- or every
// round before some round -- is one contiguous key range.
//
// Pure functions and constants, safe from any thread; no RocksDB needed.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace tether::checkpoint {

// Tags of the meta family's per-round keys: tag | round.
constexpr char kHeaderTag = 'h';     // this shard's header for the round
constexpr char kMarkerTag = 'm';     // "shard complete", written last
constexpr char kAnnouncedTag = 'c';  // shard 0 announced the round complete
// Shard 0's RoundRecords: this prefix, then the round as 20 decimal digits.
constexpr std::string_view kRecordPrefix = "round/";

// The kind byte of a data key (weights and slots families).
constexpr char kBlockKind = 'b';
constexpr char kRowKind = 'r';

// Rounds are 0 ... kMaxRound, so that kMaxRound + 1 still bounds a range.
constexpr int64_t kMaxRound = std::numeric_limits<int64_t>::max() - 1;

// The round alone, 8 bytes big-endian: the start of every data key.
std::string RoundKey(int64_t round);
// tag | round (9 bytes).
std::string MetaKey(char tag, int64_t round);
// "round/" and the round as 20 decimal digits, so records sort by round.
std::string RecordKey(int64_t round);
// round | 'b' | tensor id (u32 BE) | block (u32 BE).
std::string BlockKey(int64_t round, uint32_t tensor, uint32_t block);
// round | 'r' | table id (u32 BE) | row key (u64 BE).
std::string RowKey(int64_t round, uint32_t table, uint64_t key);

// A data key taken apart.
struct DataKey {
  int64_t round = 0;
  char kind = 0;       // kBlockKind or kRowKind
  uint32_t id = 0;     // the tensor or table id
  uint64_t index = 0;  // the block index, or the row key
};
// The parts of a block or row key; nullopt when `key` is neither (wrong
// kind byte or length).
std::optional<DataKey> ParseDataKey(std::string_view key);
// The round of a meta key tag | round; nullopt for other keys (another
// tag, or not 9 bytes).
std::optional<int64_t> ParseMetaKey(char tag, std::string_view key);

}  // namespace tether::checkpoint
