#include "server/checkpoint_keys.h"

#include <cstdio>

namespace tether::checkpoint {
namespace {

constexpr size_t kRoundKeySize = 8;
constexpr size_t kBlockKeySize = kRoundKeySize + 1 + 4 + 4;
constexpr size_t kRowKeySize = kRoundKeySize + 1 + 4 + 8;

void PutBigEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

uint64_t GetBigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

std::string RoundKey(int64_t round) {
  std::string k;
  PutBigEndian(&k, static_cast<uint64_t>(round), 8);
  return k;
}

std::string MetaKey(char tag, int64_t round) { return tag + RoundKey(round); }

std::string RecordKey(int64_t round) {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%020lld",
                static_cast<long long>(round));
  return std::string(kRecordPrefix) + digits;
}

std::string BlockKey(int64_t round, uint32_t tensor, uint32_t block) {
  std::string k = RoundKey(round);
  k.push_back(kBlockKind);
  PutBigEndian(&k, tensor, 4);
  PutBigEndian(&k, block, 4);
  return k;
}

std::string RowKey(int64_t round, uint32_t table, uint64_t key) {
  std::string k = RoundKey(round);
  k.push_back(kRowKind);
  PutBigEndian(&k, table, 4);
  PutBigEndian(&k, key, 8);
  return k;
}

std::optional<DataKey> ParseDataKey(std::string_view key) {
  const char kind = key.size() > kRoundKeySize ? key[kRoundKeySize] : 0;
  if (!((kind == kBlockKind && key.size() == kBlockKeySize) ||
        (kind == kRowKind && key.size() == kRowKeySize))) {
    return std::nullopt;
  }
  DataKey k;
  k.round = static_cast<int64_t>(GetBigEndian(key.data(), 8));
  k.kind = kind;
  k.id = static_cast<uint32_t>(GetBigEndian(key.data() + 9, 4));
  k.index = GetBigEndian(key.data() + 13, kind == kBlockKind ? 4 : 8);
  return k;
}

std::optional<int64_t> ParseMetaKey(char tag, std::string_view key) {
  if (key.size() != 1 + kRoundKeySize || key[0] != tag) return std::nullopt;
  return static_cast<int64_t>(GetBigEndian(key.data() + 1, 8));
}

}  // namespace tether::checkpoint
