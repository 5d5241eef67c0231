// The run-wide settings the coordinator owns and hands to every shard and
// worker, and their wire form.
#pragma once

#include <boost/describe/class.hpp>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "schema/flags.h"
#include "schema/frame.h"
#include "schema/status.h"
#include "server/optimizer.h"

namespace tether {

// What each member is (its flag, whether it is part of the run's identity,
// ...) is said once, in server/settings_fields.h; flags, a round's JSON, the
// dashboard's config, the reproduce command line and resuming all follow
// from it. A new member goes into BOOST_DESCRIBE_STRUCT below and gets a row
// there; the compiler refuses one that does not.
struct RunSettings {
  // Names the run: made fresh by shard 0 when a run starts, kept across
  // resumes, stored in every shard's rounds so that a shard never serves
  // another run's (or another shard's) data. "" in rounds written before
  // run ids existed.
  std::string run_id;
  int num_shards = 1;
  int num_workers = 1;  // must join before training starts
  // Workers may join (and leave) at any time after the start, up to this
  // many at once; 0: no limit beyond shard 0's --max-connections.
  int max_workers = 0;
  uint64_t seed = 1;
  uint32_t block_size = 65536;
  OptimizerOptions optimizer;
  int max_staleness = -1;     // cap on what workers ask for; -1 none
  int reject_staleness = -1;  // pushes staler than this are refused; -1 never
  int64_t checkpoint_every = 0;   // clocks between rounds; 0 never
  int keep_checkpoints = 3;       // complete rounds every shard keeps
  int worker_timeout_ms = 10000;  // silent this long: evicted; 0 never
  int heartbeat_ms = 1000;        // workers' heartbeat period
  int backup_workers = 0;         // a clock closes with n - b workers
  bool staleness_lr = false;      // rate scaled by 1 / (1 + staleness)
  // Every shard records the order it takes pushes and pulls in, into its
  // data dir (server/recording.h), so the run can be replayed.
  bool record = false;
  int64_t resume_round = -1;  // the round every shard loads; -1 none
  // Only in the Welcome to a shard that registers again: it was restarted
  // and loads resume_round on its own (the run goes on).
  bool shard_restart = false;
};
BOOST_DESCRIBE_STRUCT(RunSettings, (),
                      (run_id, num_shards, num_workers, max_workers, seed,
                       block_size, optimizer, max_staleness, reject_staleness,
                       checkpoint_every, keep_checkpoints, worker_timeout_ms,
                       heartbeat_ms, backup_workers, staleness_lr, record,
                       resume_round, shard_restart))

// The most worker ranks a run can have, whatever --max-workers says.
inline constexpr int kMaxRanks = 4096;
// Ranks 0..RankCapacity()-1 may be held: --max-workers, or kMaxRanks when
// it is 0 (then shard 0's --max-connections is the practical limit).
inline int RankCapacity(const RunSettings& s) {
  const int cap = s.max_workers > 0 ? s.max_workers : kMaxRanks;
  return cap > s.num_workers ? cap : s.num_workers;
}

// A fresh run id: 128 random bits as 32 hex digits.
std::string NewRunId();

// The wire form, derived from the settings' description
// (server/settings_fields.h) and flatc's field table of RunConfig: every
// setting travels in the field of its member's name (the optimizer's kind
// as "optimizer"), every field written, defaults included.
flatbuffers::Offset<wire::RunConfig> WriteRunConfig(
    flatbuffers::FlatBufferBuilder& fbb, const RunSettings& settings);
// kBadFrame when a field is missing or out of range.
Result<RunSettings> ReadRunConfig(const wire::RunConfig* config);
// Whether every setting has a RunConfig field of its type and every field
// is a setting; the ones that do not, in *missing.
bool WireCarriesEverySetting(std::string* missing);

// A Welcome frame from shard `shard_id`: the run settings and, for a
// worker, its rank, enforced bound and clock; the shard map when
// `shard_addresses` (indexed by shard id) is given.
OutFrame MakeWelcomeFrame(const RunSettings& settings, int shard_id, int rank,
                          int staleness, int64_t clock,
                          const std::vector<std::string>& shard_addresses = {});

// "" when `a` (a round's settings) fits a run started with `b`, else what
// differs, e.g. "--shards 3 in the round, 2 now": the identity settings
// but the worker count (how many must join before training starts).
std::string SettingsMismatch(const RunSettings& a, const RunSettings& b);

// Whether a resumed run may change the setting of tether-server flag `flag`
// (without "--") although it is part of the run's identity: "shards" (each
// shard then loads its part of the round from every old shard's data dir,
// --reshard-from) and "workers" (how many must join before training
// starts).
bool ResumeMayChange(std::string_view flag);

// The settings a resumed run goes on with: the round's (`round`, as its
// record stored them), except for the run-wide flags named in `given`
// (without "--"; their values are in `flags`). A given flag that is part of
// the run's identity (--seed, --block-size, --optimizer) and differs from
// the round is refused naming it, e.g. "--optimizer adam in the round, sgd
// now"; any other given flag that differs (--shards and --workers too:
// ResumeMayChange) wins and is described in *overridden, e.g. "--lr 0.0005
// now (0.001 in the round)".
Result<RunSettings> ResumedSettings(const RunSettings& round,
                                    const RunSettings& flags,
                                    const std::set<std::string>& given,
                                    std::vector<std::string>* overridden);

// The bound a shard enforces for a worker that asked for `requested`
// (-1: unbounded): the request, capped by max_staleness when that is set.
int EffectiveStaleness(int requested, int max_staleness);

}  // namespace tether
