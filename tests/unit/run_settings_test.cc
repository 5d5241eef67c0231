// The run's settings (server/settings_fields.h): every described field
// through each place that lists them (a round's JSON, the wire, the flags,
// the reproduce command line, the dashboard, resuming), and a resumed run's
// settings: the round's, with flags given now either agreeing, overriding a
// tunable setting, or refused by name.
#include "server/run_settings.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <sstream>
#include <type_traits>

#include "server/checkpoint_codec.h"
#include "server/monitor.h"
#include "server/options.h"
#include "server/reproduce.h"
#include "server/settings_fields.h"

namespace tether {
namespace {

namespace json = boost::json;

// `value` moved off its default `def`, in a way that still passes
// tether-server's checks (each integer up by 3: 4 workers, 3 backup
// workers, ...; floats scaled to values a decimal does not hold exactly).
template <typename T>
T Unusual(const SettingField& field, const T& def) {
  if constexpr (std::is_same_v<T, std::string>) {
    return def + "unusual-" + std::string(field.member);
  } else if constexpr (std::is_same_v<T, bool>) {
    return !def;
  } else if constexpr (std::is_same_v<T, OptimizerKind>) {
    return def == OptimizerKind::kAdam ? OptimizerKind::kAdaGrad
                                       : OptimizerKind::kAdam;
  } else if constexpr (std::is_floating_point_v<T>) {
    return def * 0.7f;
  } else if (field.member == "max_workers") {
    return static_cast<T>(def + 8);  // at least --workers (4 here)
  } else {
    return static_cast<T>(def + 3);
  }
}

// Every described setting away from its default, so that a place that
// drops one shows; a new field is covered without being named here.
RunSettings EveryFieldUnusual() {
  RunSettings s;
  ForEachSetting(s, [](const SettingField& field, auto& value) {
    value = Unusual(field, value);
  });
  return s;
}

// Expects every setting for which `compared(field)` holds to be equal in
// `a` (what came back) and `b` (what went in), and every other setting of
// `a` to be at its default; says which setting and through what.
template <typename Compared>
void ExpectSame(const RunSettings& a, const RunSettings& b,
                const std::string& through, Compared compared) {
  const RunSettings defaults;
  ForEachSettingPair(
      a, b, [&](const SettingField& field, const auto& x, const auto& y) {
        const auto& expected = compared(field) ? y : x;
        EXPECT_TRUE(x == expected) << field.member << " through " << through;
      });
  ForEachSettingPair(
      a, defaults,
      [&](const SettingField& field, const auto& x, const auto& def) {
        if (compared(field)) return;
        EXPECT_TRUE(x == def) << field.member << " (not in " << through
                              << ") is not at its default";
      });
}

bool All(const SettingField&) { return true; }
bool IsFlag(const SettingField& f) { return !f.flag.empty(); }
bool InRound(const SettingField& f) { return !f.Has(kWelcomeOnly); }

TEST(RunSettings, TheTestMovesEveryFieldOffItsDefault) {
  const RunSettings s = EveryFieldUnusual();
  const RunSettings defaults;
  int fields = 0;
  ForEachSettingPair(
      s, defaults,
      [&](const SettingField& field, const auto& x, const auto& def) {
        EXPECT_FALSE(x == def) << field.member;
        ++fields;
      });
  EXPECT_GE(fields, 20);
}

TEST(RunSettings, EveryFieldButWelcomeOnlyRoundTripsThroughARoundsJson) {
  const RunSettings s = EveryFieldUnusual();
  // Boost.JSON's value_from is the round's JSON.
  EXPECT_EQ(checkpoint::SettingsToJson(s), json::value_from(s));
  // Through text, as the store keeps it.
  const json::value v =
      json::parse(json::serialize(checkpoint::SettingsToJson(s)));
  Result<RunSettings> back = checkpoint::SettingsFromJson(v);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSame(*back, s, "a round's JSON", InRound);
  // The keys existing rounds have: the members' names, the optimizer's in
  // an object.
  EXPECT_EQ(v.at("num_shards"), s.num_shards);
  EXPECT_EQ(v.at("optimizer").at("kind"), OptimizerName(s.optimizer.kind));
  EXPECT_FALSE(v.as_object().contains("shard_restart"));
}

TEST(RunSettings, EveryFieldRoundTripsThroughTheWire) {
  const RunSettings s = EveryFieldUnusual();
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(WriteRunConfig(fbb, s));
  const auto* config =
      flatbuffers::GetRoot<wire::RunConfig>(fbb.GetBufferPointer());
  Result<RunSettings> back = ReadRunConfig(config);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSame(*back, s, "the wire", All);
}

TEST(RunSettings, EveryDescribedSettingHasAWireFieldOfItsType) {
  std::string missing;
  EXPECT_TRUE(WireCarriesEverySetting(&missing)) << missing;
}

// flatc's own accessors read what the derived writer wrote: the slots it
// takes from the field table are the generated ones.
TEST(RunSettings, GeneratedAccessorsReadTheDerivedWireForm) {
  const RunSettings s = EveryFieldUnusual();
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(WriteRunConfig(fbb, s));
  flatbuffers::Verifier verifier(fbb.GetBufferPointer(), fbb.GetSize());
  ASSERT_TRUE(verifier.VerifyBuffer<wire::RunConfig>(nullptr));
  const auto* c = flatbuffers::GetRoot<wire::RunConfig>(fbb.GetBufferPointer());
  EXPECT_EQ(c->seed(), s.seed);
  EXPECT_EQ(c->num_shards(), s.num_shards);
  EXPECT_EQ(c->block_size(), s.block_size);
  EXPECT_EQ(c->checkpoint_every(), s.checkpoint_every);
  EXPECT_EQ(c->optimizer()->str(), OptimizerName(s.optimizer.kind));
  EXPECT_EQ(c->epsilon(), s.optimizer.epsilon);
  EXPECT_EQ(c->staleness_lr(), s.staleness_lr);
  EXPECT_EQ(c->heartbeat_ms(), s.heartbeat_ms);
  EXPECT_EQ(c->run_id()->str(), s.run_id);
  EXPECT_EQ(c->keep_checkpoints(), s.keep_checkpoints);
}

TEST(RunSettings, AWireFormLackingAFieldIsRefusedNamingIt) {
  // flatc's builder leaves out fields at their schema defaults (seed 0).
  flatbuffers::FlatBufferBuilder fbb;
  auto run_id = fbb.CreateString("r");
  wire::RunConfigBuilder b(fbb);
  b.add_run_id(run_id);
  b.add_num_shards(2);
  b.add_num_workers(2);
  b.add_max_workers(8);
  b.add_seed(0);  // the default: left out
  fbb.Finish(b.Finish());
  Result<RunSettings> back = ReadRunConfig(
      flatbuffers::GetRoot<wire::RunConfig>(fbb.GetBufferPointer()));
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), Code::kBadFrame);
  EXPECT_NE(back.status().message().find("lacks seed"), std::string::npos)
      << back.status().message();
}

// tether-server's options from `argv` (argv[0] the program), which must
// parse.
ServerOptions Parse(const std::vector<std::string>& argv) {
  std::vector<const char*> args;
  for (const std::string& a : argv) args.push_back(a.c_str());
  bool help = false;
  Result<ServerOptions> o =
      ParseServerOptions(static_cast<int>(args.size()), args.data(), &help);
  EXPECT_TRUE(o.ok()) << o.status().ToString();
  return o.ok() ? *o : ServerOptions{};
}

TEST(ServerOptions, SpinUsIsTakenInItsRangeAndRefusedOutsideNamingTheFlag) {
  EXPECT_EQ(Parse({"tether-server"}).spin_us, 0);
  EXPECT_EQ(Parse({"tether-server", "--spin-us", "50"}).spin_us, 50);
  for (const char* bad : {"-1", "10001"}) {
    const char* argv[] = {"tether-server", "--spin-us", bad};
    bool help = false;
    Result<ServerOptions> o = ParseServerOptions(3, argv, &help);
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_EQ(o.status().message(), "--spin-us: must be in 0..10000") << bad;
  }
}

TEST(RunSettings, EveryFlagRoundTripsThroughTetherServersFlags) {
  const RunSettings s = EveryFieldUnusual();
  std::vector<std::string> argv = {"tether-server", "--data-dir", "/tmp/x"};
  for (std::string& word : SettingFlags(s, All, AtDefault::kWritten)) {
    argv.push_back(std::move(word));
  }
  const ServerOptions o = Parse(argv);
  ExpectSame(o.run, s, "tether-server's flags", IsFlag);
  // Every one counts as given, so that a resumed run takes it.
  for (const SettingField& f : kSettingFields) {
    if (IsFlag(f)) {
      EXPECT_EQ(o.given.count(std::string(f.flag)), 1u) << f.flag;
    }
  }
  // And each is in the usage.
  const std::string usage = ServerUsage();
  for (const SettingField& f : kSettingFields) {
    if (!IsFlag(f)) continue;
    EXPECT_NE(usage.find("\n  --" + std::string(f.flag)), std::string::npos)
        << f.flag;
  }
}

// `text` split at its spaces (the reproduce line quotes nothing here).
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

TEST(RunSettings, EveryFlagRoundTripsThroughTheReproduceCommand) {
  const RunSettings s = EveryFieldUnusual();
  const ServerOptions o = Parse(Words(ReproduceCommand(s)));
  ExpectSame(o.run, s, "the reproduce command", IsFlag);
  // Shard 0's own command line gives way to the settings.
  const ServerOptions again = Parse(
      Words(ShardCommand({"tether-server", "--shard-id", "0", "--staleness-lr",
                          "--lr", "5", "--shards=9", "--data-dir", "/tmp/x"},
                         "", &s)));
  ExpectSame(again.run, s, "shard 0's command", IsFlag);
}

// The dashboard's value of a setting read back as its type.
template <typename T>
T FromDashboard(const json::value& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(v.as_string());
  } else if constexpr (std::is_same_v<T, bool>) {
    return v.as_bool();
  } else if constexpr (std::is_same_v<T, OptimizerKind>) {
    return *ParseOptimizerKind(std::string(v.as_string()));
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v.to_number<double>());
  } else {
    return v.to_number<T>();
  }
}

TEST(RunSettings, EveryFieldButWelcomeOnlyIsInTheDashboardsConfig) {
  const RunSettings s = EveryFieldUnusual();
  Monitor monitor(s);
  const json::value config = json::parse(*monitor.Document("config"));
  ForEachSetting(s, [&](const SettingField& field, const auto& value) {
    const std::string key = DashboardKey(field);
    const json::value* v = config.as_object().if_contains(key);
    if (field.Has(kWelcomeOnly)) {
      EXPECT_EQ(v, nullptr) << key;
      return;
    }
    ASSERT_NE(v, nullptr) << key << " is not in " << config;
    using T = std::remove_cvref_t<decltype(value)>;
    EXPECT_TRUE(FromDashboard<T>(*v) == value) << key << ": " << *v;
  });
  // The keys web/app.js reads.
  for (const char* key : {"shards", "workers", "optimizer", "lr",
                          "max_staleness", "keep_checkpoints", "run_id"}) {
    EXPECT_TRUE(config.as_object().contains(key)) << key;
  }
}

TEST(RunSettings, EveryIdentityFieldIsAMismatchAndEveryFlagResumes) {
  const RunSettings round = EveryFieldUnusual();
  const RunSettings defaults;
  ForEachSettingPair(
      round, defaults,
      [&](const SettingField& field, const auto&, const auto&) {
        if (!IsFlag(field)) return;
        const std::string flag(field.flag);
        // Only this setting back at its default, given as a flag.
        RunSettings now = round;
        ForEachSettingPair(
            now, defaults,
            [&](const SettingField& f, auto& x, const auto& def) {
              if (&f == &field) x = def;
            });
        std::vector<std::string> said;
        auto s = ResumedSettings(round, now, {flag}, &said);
        const std::string mismatch = SettingsMismatch(round, now);
        if (field.Has(kIdentity) && !ResumeMayChange(flag)) {
          EXPECT_FALSE(s.ok()) << flag;
          EXPECT_EQ(mismatch.rfind("--" + flag + " ", 0), 0u) << mismatch;
        } else if (field.Has(kIdentity)) {
          // --shards and --workers: a resume may change them, said in the
          // log; a slice must still have been written by as many shards as
          // serve it (a resharded round is merged first).
          EXPECT_EQ(mismatch.empty(), flag == "workers") << mismatch;
          if (flag == "workers") {
            // 1 worker (the default) is not more than the round's 3 backup
            // workers.
            ASSERT_FALSE(s.ok());
            EXPECT_NE(s.status().message().find("--backup-workers"),
                      std::string::npos);
            return;
          }
          ASSERT_TRUE(s.ok()) << s.status().ToString();
          ASSERT_EQ(said.size(), 1u) << flag;
          EXPECT_EQ(said[0].rfind("--" + flag + " ", 0), 0u) << said[0];
        } else {
          ASSERT_TRUE(s.ok()) << s.status().ToString();
          ExpectSame(
              *s, now, "--resume with --" + flag,
              [](const SettingField& f) { return !f.Has(kWelcomeOnly); });
          ASSERT_EQ(said.size(), 1u) << flag;
          EXPECT_EQ(said[0].rfind("--" + flag + " ", 0), 0u) << said[0];
          EXPECT_EQ(mismatch, "") << flag;
        }
      });
}

RunSettings Round() {
  RunSettings r;
  r.run_id = "abc";
  r.seed = 21;
  r.num_shards = 2;
  r.num_workers = 4;
  r.block_size = 4096;
  r.max_staleness = 3;
  r.checkpoint_every = 60;
  r.optimizer.kind = OptimizerKind::kAdam;
  r.optimizer.lr = 0.001f;
  r.backup_workers = 1;
  r.staleness_lr = true;
  return r;
}

TEST(ResumedSettings, FlagsNotGivenComeFromTheRound) {
  RunSettings defaults;  // what flags left out hold
  auto s = ResumedSettings(Round(), defaults, {}, nullptr);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->seed, 21u);
  EXPECT_EQ(s->num_shards, 2);
  EXPECT_EQ(s->num_workers, 4);
  EXPECT_EQ(s->block_size, 4096u);
  EXPECT_EQ(s->max_staleness, 3);
  EXPECT_EQ(s->checkpoint_every, 60);
  EXPECT_EQ(s->optimizer.kind, OptimizerKind::kAdam);
  EXPECT_EQ(s->optimizer.lr, 0.001f);
  EXPECT_EQ(s->backup_workers, 1);
  EXPECT_TRUE(s->staleness_lr);
  EXPECT_EQ(s->run_id, "abc");
}

TEST(ResumedSettings, AGivenIdentityFlagThatDiffersIsRefusedNamingIt) {
  RunSettings now = Round();
  now.optimizer.kind = OptimizerKind::kSgd;
  auto s = ResumedSettings(Round(), now, {"optimizer"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--optimizer adam in the round, sgd now"),
            std::string::npos)
      << s.status().message();

  now = Round();
  now.block_size = 512;
  s = ResumedSettings(Round(), now, {"block-size"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(
      s.status().message().find("--block-size 4096 in the round, 512 now"),
      std::string::npos)
      << s.status().message();

  // The same value given again is fine; a differing value not given is the
  // flag's default and does not count.
  now = Round();
  now.seed = 99;
  EXPECT_TRUE(
      ResumedSettings(Round(), Round(), {"seed", "workers"}, nullptr).ok());
  EXPECT_TRUE(ResumedSettings(Round(), now, {"workers"}, nullptr).ok());
}

TEST(ResumedSettings, TheShardAndWorkerCountsMayChangeAndAreSaid) {
  RunSettings now = Round();
  now.num_shards = 3;
  now.num_workers = 2;
  std::vector<std::string> said;
  auto s = ResumedSettings(Round(), now, {"shards", "workers"}, &said);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->num_shards, 3);
  EXPECT_EQ(s->num_workers, 2);
  EXPECT_EQ(s->seed, 21u);  // the rest from the round
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[0], "--shards 3 now (2 in the round)");
  EXPECT_EQ(said[1], "--workers 2 now (4 in the round)");
  // No workers needed at the start: an observer may take a round at once.
  now.num_workers = 0;
  now.backup_workers = 0;
  EXPECT_TRUE(
      ResumedSettings(Round(), now, {"workers", "backup-workers"}, nullptr)
          .ok());
}

TEST(ResumedSettings, AGivenTunableFlagOverridesTheRoundAndIsSaid) {
  RunSettings now;
  now.optimizer.lr = 0.0005f;
  now.max_staleness = 1;
  std::vector<std::string> said;
  auto s = ResumedSettings(Round(), now, {"lr", "max-staleness"}, &said);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->optimizer.lr, 0.0005f);
  EXPECT_EQ(s->max_staleness, 1);
  EXPECT_EQ(s->optimizer.kind, OptimizerKind::kAdam);  // from the round
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[0], "--lr 0.0005 now (0.001 in the round)");
  EXPECT_EQ(said[1], "--max-staleness 1 now (3 in the round)");
}

TEST(ResumedSettings, BackupWorkersMustStayBelowTheRoundsWorkers) {
  RunSettings now;
  now.backup_workers = 4;
  auto s = ResumedSettings(Round(), now, {"backup-workers"}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--backup-workers"), std::string::npos);
}

}  // namespace
}  // namespace tether
