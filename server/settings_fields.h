// The run's settings described once. RunSettings and OptimizerOptions list
// their members with BOOST_DESCRIBE_STRUCT; kSettingFields says what each
// member is: its tether-server flag and help, whether it is part of the
// run's identity, where it is accepted and stored. Everything that lists
// the settings walks these two: tether-server's flags (server/options.cc),
// a round's JSON (server/checkpoint_codec.cc), the dashboard's config
// (server/monitor_json.cc), the command line that starts a run again
// (server/reproduce.cc), resuming (server/run_settings.cc) and tether-up.
// A described member without a row, or a RunSettings member that is not
// described, does not compile.
//
// Header-only and pure; thread-safe.
#pragma once

#include <boost/describe/members.hpp>
#include <boost/mp11/algorithm.hpp>
#include <boost/pfr/core.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "schema/flags.h"
#include "server/optimizer.h"
#include "server/run_settings.h"

namespace tether {

// What a setting is, besides its name and type (bits of SettingField::traits).
enum SettingTrait : unsigned {
  // Part of the run's identity: a resumed run keeps it (a differing flag is
  // refused), and a round of another value belongs to another run.
  kIdentity = 1u << 0,
  // Shards other than 0 accept its flag too (--shards: checked against the
  // coordinator's; --checkpoint-every: theirs is not used); the other
  // run-wide flags are refused there.
  kAnyShard = 1u << 1,
  // In every round since the format's first version: a round's JSON without
  // it is refused. Members added since keep their defaults when absent, so
  // a new member must not have this.
  kInFirstRounds = 1u << 2,
  // Only in a Welcome: not in a round, the dashboard or a flag.
  kWelcomeOnly = 1u << 3,
  // The command line that starts the run again leaves its flag out at its
  // default (a copy of a run that takes no checkpoints needs no --data-dir).
  kOmitAtDefault = 1u << 4,
};

struct SettingField {
  // The member's name (RunSettings', or OptimizerOptions' for the
  // optimizer's): its key in a round's JSON.
  std::string_view member;
  // tether-server's flag without "--", also the dashboard's key (with '_'
  // for '-'); "" when the setting is not a flag (the member's name is the
  // dashboard's key then).
  std::string_view flag;
  std::string_view help;  // the flag's line in the usage
  unsigned traits = 0;

  bool Has(SettingTrait t) const { return (traits & t) != 0; }
};

// Every described member of RunSettings and OptimizerOptions, in their
// declaration order.
inline constexpr SettingField kSettingFields[] = {
    {"run_id", "", "", 0},
    {"num_shards", "shards", "number of shards in the run",
     kIdentity | kAnyShard | kInFirstRounds},
    {"num_workers", "workers", "workers that must join before training starts",
     kIdentity | kInFirstRounds},
    {"max_workers", "max-workers",
     "most workers at once: more than --workers may join after the start; "
     "0: no limit beyond --max-connections",
     kOmitAtDefault},
    {"seed", "seed", "run seed from which every other seed derives",
     kIdentity | kInFirstRounds},
    {"block_size", "block-size", "floats per dense block",
     kIdentity | kInFirstRounds},
    // The optimizer's members follow; in a round they are an object.
    {"optimizer", "", "", kInFirstRounds},
    {"kind", "optimizer", "sgd, momentum, adagrad or adam",
     kIdentity | kInFirstRounds},
    {"lr", "lr", "learning rate", kInFirstRounds},
    {"momentum", "momentum", "momentum coefficient", kInFirstRounds},
    {"beta1", "beta1", "Adam beta1", kInFirstRounds},
    {"beta2", "beta2", "Adam beta2", kInFirstRounds},
    {"epsilon", "epsilon", "AdaGrad/Adam epsilon", kInFirstRounds},
    {"max_staleness", "max-staleness",
     "cap on the staleness bound workers may ask for; -1: no cap",
     kInFirstRounds},
    {"reject_staleness", "reject-staleness",
     "reject pushes staler than this many clocks; -1: never", kInFirstRounds},
    {"checkpoint_every", "checkpoint-every",
     "write a checkpoint round every K clocks into --data-dir; 0: never",
     kAnyShard | kInFirstRounds | kOmitAtDefault},
    {"keep_checkpoints", "keep-checkpoints",
     "complete rounds to keep; older ones are deleted", kOmitAtDefault},
    {"worker_timeout_ms", "worker-timeout-ms",
     "a worker silent this long is evicted: it no longer holds back the "
     "others; 0: never",
     0},
    {"heartbeat_ms", "heartbeat-ms",
     "how often workers send heartbeats to every shard", 0},
    {"backup_workers", "backup-workers",
     "BSP: a clock closes when all but this many live workers have finished "
     "it; later pushes for it are dropped and counted",
     0},
    {"staleness_lr", "staleness-lr",
     "scale each push's learning rate by 1 / (1 + its staleness)", 0},
    {"record", "record",
     "every shard records the order it applies pushes and answers pulls in, "
     "into its --data-dir, so that --replay can repeat the run bit for bit",
     kOmitAtDefault},
    {"resume_round", "", "", kInFirstRounds},
    {"shard_restart", "", "", kWelcomeOnly},
};

// The row of `member`, or nullptr.
constexpr const SettingField* FindSettingField(std::string_view member) {
  for (const SettingField& f : kSettingFields) {
    if (f.member == member) return &f;
  }
  return nullptr;
}

// The row of tether-server flag `flag` (without "--"), or nullptr.
constexpr const SettingField* FindSettingFlag(std::string_view flag) {
  for (const SettingField& f : kSettingFields) {
    if (!f.flag.empty() && f.flag == flag) return &f;
  }
  return nullptr;
}

// The dashboard's key for a setting (web/API.md, config): its flag with '_'
// for '-' ("max_staleness", "optimizer" for the optimizer's kind), or the
// member's name when it is not a flag ("run_id").
inline std::string DashboardKey(const SettingField& field) {
  std::string key(field.flag.empty() ? field.member : field.flag);
  for (char& c : key) {
    if (c == '-') c = '_';
  }
  return key;
}

template <typename T>
inline constexpr bool kIsSettingsGroup =
    boost::describe::has_describe_members<std::remove_cvref_t<T>>::value;

// Calls f(field, member_of_a, member_of_b) for every described member of
// `a` and `b` (the same type, either const), in declaration order; a member
// that is a described struct (the optimizer) is passed whole.
template <typename A, typename B, typename F>
void ForEachMemberPair(A& a, B& b, F&& f) {
  using T = std::remove_cvref_t<A>;
  static_assert(std::is_same_v<T, std::remove_cvref_t<B>>);
  using Members =
      boost::describe::describe_members<T, boost::describe::mod_public>;
  // Describe lists what it is told; PFR counts what there is.
  static_assert(
      boost::mp11::mp_size<Members>::value == boost::pfr::tuple_size_v<T>,
      "a member is missing from BOOST_DESCRIBE_STRUCT");
  boost::mp11::mp_for_each<Members>([&](auto d) {
    constexpr const SettingField* row = FindSettingField(decltype(d)::name);
    static_assert(row != nullptr,
                  "a described member has no row in kSettingFields");
    f(*row, a.*d.pointer, b.*d.pointer);
  });
}

// Calls f(field, setting_of_a, setting_of_b) for every setting of `a` and
// `b` (RunSettings, either const), in declaration order, the optimizer's
// members in place of the optimizer.
template <typename A, typename B, typename F>
void ForEachSettingPair(A& a, B& b, F&& f) {
  ForEachMemberPair(a, b, [&f](const SettingField& field, auto& x, auto& y) {
    if constexpr (kIsSettingsGroup<decltype(x)>) {
      ForEachSettingPair(x, y, f);
    } else {
      f(field, x, y);
    }
  });
}

// Calls f(field, setting) for every setting of `s`, as ForEachSettingPair.
template <typename S, typename F>
void ForEachSetting(S& s, F&& f) {
  ForEachSettingPair(
      s, s, [&f](const SettingField& field, auto& x, auto&) { f(field, x); });
}

// A setting's value as its flag takes it: integers in decimal, floats as
// NumberText writes them ("0.001", "1e-08"), the optimizer by name, a bool
// as true or false.
inline std::string SettingText(const std::string& v) { return v; }
inline std::string SettingText(bool v) { return v ? "true" : "false"; }
inline std::string SettingText(float v) { return NumberText(v); }
inline std::string SettingText(OptimizerKind v) { return OptimizerName(v); }
template <typename T>
requires std::is_integral_v<T> std::string SettingText(T v) {
  return std::to_string(v);
}

// Binds tether-server's flag of every setting in `s` for which
// `wanted(field)` holds to that setting, with its help and, as the
// default, its value in *s now.
template <typename Wanted>
void BindSettingFlags(FlagParser& p, RunSettings* s, Wanted wanted) {
  ForEachSetting(*s, [&](const SettingField& field, auto& value) {
    if (field.flag.empty() || !wanted(field)) return;
    const std::string name(field.flag);
    const std::string help(field.help);
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, bool>) {
      p.AddBool(name, &value, help);
    } else if constexpr (std::is_same_v<T, int>) {
      p.AddInt(name, &value, help);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      p.AddInt64(name, &value, help);
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      p.AddUint64(name, &value, help);
    } else if constexpr (std::is_same_v<T, uint32_t>) {
      p.AddUint32(name, &value, help);
    } else if constexpr (std::is_same_v<T, float>) {
      p.AddFloat(name, &value, help);
    } else if constexpr (std::is_same_v<T, OptimizerKind>) {
      p.AddCustom(name, help, OptimizerName(value),
                  [&value](const std::string& text) -> Status {
                    TETHER_ASSIGN_OR_RETURN(value, ParseOptimizerKind(text));
                    return Status::Ok();
                  });
    } else {
      static_assert(std::is_same_v<T, std::string>,
                    "a setting's type needs a flag binding here");
    }
  });
}

// Which settings SettingFlags writes at their defaults.
enum class AtDefault { kWritten, kOmittedWhereMarked };

// The flags (each "--name" then, unless a bool, its value) that give every
// setting of `s` for which `wanted(field)` holds its value; a bool only when
// true, and with kOmittedWhereMarked a kOmitAtDefault setting only when not
// at its default. In declaration order.
template <typename Wanted>
std::vector<std::string> SettingFlags(const RunSettings& s, Wanted wanted,
                                      AtDefault at_default) {
  static const RunSettings kDefaults;
  std::vector<std::string> out;
  ForEachSettingPair(
      s, kDefaults,
      [&](const SettingField& field, const auto& value, const auto& def) {
        if (field.flag.empty() || !wanted(field)) return;
        if (at_default == AtDefault::kOmittedWhereMarked &&
            field.Has(kOmitAtDefault) && value == def) {
          return;
        }
        const std::string flag = "--" + std::string(field.flag);
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(value)>,
                                     bool>) {
          if (value) out.push_back(flag);
        } else {
          out.push_back(flag);
          out.push_back(SettingText(value));
        }
      });
  return out;
}

// The SettingText of the setting whose flag is `flag` (without "--"); ""
// when no setting has that flag.
inline std::string SettingTextOf(const RunSettings& s, std::string_view flag) {
  std::string out;
  ForEachSetting(s, [&](const SettingField& field, const auto& value) {
    if (!field.flag.empty() && field.flag == flag) out = SettingText(value);
  });
  return out;
}

}  // namespace tether
