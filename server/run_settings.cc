#include "server/run_settings.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>

#include "schema/flags.h"
#include "server/settings_fields.h"

namespace tether {

std::string NewRunId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char part[9];
    std::snprintf(part, sizeof(part), "%08x", random());
    id += part;
  }
  return id;
}

namespace {

// The wire's RunConfig as flatc describes it (flatc --reflect-names): each
// field's vtable slot and type, found by name. Its fields are the settings
// under their members' names (the optimizer's kind as "optimizer", by
// name), so both directions below walk the settings' description and never
// list a field.
struct WireSlot {
  flatbuffers::voffset_t slot = 0;
  flatbuffers::ElementaryType type = flatbuffers::ET_UTYPE;
};

std::string_view WireName(const SettingField& field) {
  return field.member == "kind" ? std::string_view("optimizer") : field.member;
}

const WireSlot* FindWireSlot(std::string_view name) {
  static const std::vector<std::pair<std::string, WireSlot>> slots = [] {
    std::vector<std::pair<std::string, WireSlot>> out;
    const flatbuffers::TypeTable* table = wire::RunConfigTypeTable();
    for (size_t i = 0; i < table->num_elems; ++i) {
      // Field i of a table sits in vtable slot i + 2
      // (FLATBUFFERS_FIELD_OFFSET).
      out.push_back({table->names[i],
                     {static_cast<flatbuffers::voffset_t>(
                          (i + 2) * sizeof(flatbuffers::voffset_t)),
                      static_cast<flatbuffers::ElementaryType>(
                          table->type_codes[i].base_type)}});
    }
    return out;
  }();
  for (const auto& [n, slot] : slots) {
    if (n == name) return &slot;
  }
  return nullptr;
}

// How a setting of type T travels: its wire type, and the scalar type
// FlatBuffers stores it as (a bool as a byte).
template <typename T>
constexpr flatbuffers::ElementaryType kWireType =
    std::is_same_v<T, bool>       ? flatbuffers::ET_BOOL
    : std::is_same_v<T, int32_t>  ? flatbuffers::ET_INT
    : std::is_same_v<T, uint32_t> ? flatbuffers::ET_UINT
    : std::is_same_v<T, int64_t>  ? flatbuffers::ET_LONG
    : std::is_same_v<T, uint64_t> ? flatbuffers::ET_ULONG
    : std::is_same_v<T, float>    ? flatbuffers::ET_FLOAT
                                  : flatbuffers::ET_STRING;
template <typename T>
using StoredAs = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
template <typename T>
constexpr bool kTravelsAsString =
    std::is_same_v<T, std::string> || std::is_same_v<T, OptimizerKind>;

// The slot of `field` on the wire. A setting without a field of its type
// there is a build that cannot talk to itself:
// RunSettings.EveryDescribedSettingHasAWireFieldOfItsType says so first.
template <typename T>
flatbuffers::voffset_t SlotOf(const SettingField& field) {
  const WireSlot* slot = FindWireSlot(WireName(field));
  if (slot == nullptr || slot->type != kWireType<T>) {
    std::fprintf(stderr,
                 "tether: setting %s has no wire field of its type in "
                 "schema/tether.fbs (RunConfig)\n",
                 std::string(field.member).c_str());
    std::abort();
  }
  return slot->slot;
}

}  // namespace

bool WireCarriesEverySetting(std::string* missing) {
  RunSettings s;
  bool ok = true;
  ForEachSetting(s, [&](const SettingField& field, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    const WireSlot* slot = FindWireSlot(WireName(field));
    if (slot == nullptr || slot->type != kWireType<T>) {
      ok = false;
      if (missing != nullptr) *missing += std::string(field.member) + " ";
    }
  });
  // And nothing on the wire that is not a setting.
  const flatbuffers::TypeTable* table = wire::RunConfigTypeTable();
  for (size_t i = 0; i < table->num_elems; ++i) {
    bool described = false;
    ForEachSetting(s, [&](const SettingField& field, const auto&) {
      described = described || WireName(field) == table->names[i];
    });
    if (!described) {
      ok = false;
      if (missing != nullptr) *missing += std::string(table->names[i]) + " ";
    }
  }
  return ok;
}

flatbuffers::Offset<wire::RunConfig> WriteRunConfig(
    flatbuffers::FlatBufferBuilder& fbb, const RunSettings& s) {
  // Strings are built before the table that points at them.
  std::vector<std::pair<flatbuffers::voffset_t, flatbuffers::Offset<void>>>
      strings;
  ForEachSetting(s, [&](const SettingField& field, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, OptimizerKind>) {
      strings.push_back(
          {SlotOf<T>(field), fbb.CreateString(OptimizerName(value)).Union()});
    } else if constexpr (std::is_same_v<T, std::string>) {
      strings.push_back({SlotOf<T>(field), fbb.CreateString(value).Union()});
    }
  });
  const flatbuffers::uoffset_t start = fbb.StartTable();
  ForEachSetting(s, [&](const SettingField& field, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (!kTravelsAsString<T>) {
      // Every field, defaults included: readers see each one.
      fbb.AddElement<StoredAs<T>>(SlotOf<T>(field),
                                  static_cast<StoredAs<T>>(value));
    }
  });
  for (const auto& [slot, offset] : strings) fbb.AddOffset(slot, offset);
  return flatbuffers::Offset<wire::RunConfig>(fbb.EndTable(start));
}

Result<RunSettings> ReadRunConfig(const wire::RunConfig* config) {
  if (config == nullptr) {
    return BadFrame("Welcome carries no run configuration");
  }
  // The generated table is a flatbuffers::Table underneath.
  const auto* table = reinterpret_cast<const flatbuffers::Table*>(config);
  RunSettings s;
  Status status;
  ForEachSetting(s, [&](const SettingField& field, auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    if (!status.ok()) return;
    const flatbuffers::voffset_t slot = SlotOf<T>(field);
    if (!table->CheckField(slot)) {
      status = BadFrame("the run configuration lacks " +
                        std::string(WireName(field)));
      return;
    }
    if constexpr (kTravelsAsString<T>) {
      const auto* text = table->GetPointer<const flatbuffers::String*>(slot);
      if (text == nullptr) {
        status = BadFrame("the run configuration lacks " +
                          std::string(WireName(field)));
        return;
      }
      if constexpr (std::is_same_v<T, OptimizerKind>) {
        Result<OptimizerKind> kind = ParseOptimizerKind(text->str());
        if (!kind.ok()) {
          status = BadFrame(kind.status().message());
          return;
        }
        value = *kind;
      } else {
        value = text->str();
      }
    } else {
      value = static_cast<T>(table->GetField<StoredAs<T>>(slot, 0));
    }
  });
  TETHER_RETURN_IF_ERROR(status);
  if (s.num_shards < 1 || s.num_workers < 0 || s.block_size < 1 ||
      s.worker_timeout_ms < 0 || s.heartbeat_ms < 1 || s.backup_workers < 0 ||
      s.keep_checkpoints < 1) {
    return BadFrame("run configuration out of range");
  }
  return s;
}

OutFrame MakeWelcomeFrame(const RunSettings& settings, int shard_id, int rank,
                          int staleness, int64_t clock,
                          const std::vector<std::string>& shard_addresses) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  auto config = WriteRunConfig(fbb, settings);
  flatbuffers::Offset<wire::ShardMap> map;
  if (!shard_addresses.empty()) {
    std::vector<flatbuffers::Offset<wire::ShardInfo>> shards;
    shards.reserve(shard_addresses.size());
    for (size_t i = 0; i < shard_addresses.size(); ++i) {
      shards.push_back(wire::CreateShardInfo(
          fbb, static_cast<int>(i), fbb.CreateString(shard_addresses[i])));
    }
    map = wire::CreateShardMap(fbb, fbb.CreateVector(shards));
  }
  wire::WelcomeBuilder b(fbb);
  b.add_rank(rank);
  b.add_clock(clock);
  b.add_staleness(staleness);
  b.add_shard_id(shard_id);
  b.add_config(config);
  if (!map.IsNull()) b.add_shard_map(map);
  return FinishFrame(fbb, b.Finish());
}

namespace {

// A setting as messages say it: SettingText's, but a bool on or off.
template <typename T>
std::string Said(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "on" : "off";
  } else {
    return SettingText(v);
  }
}

// Merges one setting into a resumed run's: the round's value unless the
// flag was given; a given identity flag that differs is an error.
class ResumeMerge {
 public:
  ResumeMerge(const std::set<std::string>& given,
              std::vector<std::string>* overridden)
      : given_(given), overridden_(overridden) {}

  template <typename T>
  void operator()(const std::string& flag, bool identity, const T& now,
                  T* value) {
    if (!error_.empty() || given_.count(flag) == 0 || now == *value) return;
    const std::string differs = "--" + flag + " " + Said(*value) +
                                " in the round, " + Said(now) + " now";
    if (identity) {
      error_ = differs + ": a resumed run keeps it; leave --" + flag +
               " out to take the round's";
      return;
    }
    if (overridden_ != nullptr) {
      overridden_->push_back("--" + flag + " " + Said(now) + " now (" +
                             Said(*value) + " in the round)");
    }
    *value = now;
  }

  const std::string& error() const { return error_; }

 private:
  const std::set<std::string>& given_;
  std::vector<std::string>* overridden_;
  std::string error_;
};

}  // namespace

bool ResumeMayChange(std::string_view flag) {
  return flag == "shards" || flag == "workers";
}

std::string SettingsMismatch(const RunSettings& a, const RunSettings& b) {
  std::string out;
  ForEachSettingPair(
      a, b, [&out](const SettingField& field, const auto& x, const auto& y) {
        if (!out.empty() || !field.Has(kIdentity) || x == y) return;
        // A slice must have been written by as many shards as it is served
        // by (a resharded round is merged first), but any worker count fits.
        if (field.flag == "workers") return;
        out = "--" + std::string(field.flag) + " " + Said(x) +
              " in the round, " + Said(y) + " now";
      });
  return out;
}

Result<RunSettings> ResumedSettings(const RunSettings& round,
                                    const RunSettings& flags,
                                    const std::set<std::string>& given,
                                    std::vector<std::string>* overridden) {
  RunSettings s = round;
  s.shard_restart = false;
  ResumeMerge merge(given, overridden);
  ForEachSettingPair(
      flags, s,
      [&merge](const SettingField& field, const auto& now, auto& value) {
        if (field.flag.empty()) return;
        merge(std::string(field.flag),
              field.Has(kIdentity) && !ResumeMayChange(field.flag), now,
              &value);
      });
  if (!merge.error().empty()) return InvalidArgument(merge.error());
  if (s.backup_workers >= s.num_workers && s.num_workers > 0) {
    return InvalidArgument(
        "--backup-workers: " + std::to_string(s.backup_workers) +
        " is not below the resumed run's " + std::to_string(s.num_workers) +
        " workers (--workers)");
  }
  return s;
}

int EffectiveStaleness(int requested, int max_staleness) {
  if (max_staleness < 0) return requested < 0 ? -1 : requested;
  if (requested < 0) return max_staleness;
  return std::min(requested, max_staleness);
}

}  // namespace tether
