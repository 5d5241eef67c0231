// tether-ckpt: inspects, checks and exports the checkpoints tether-server
// writes under each shard's --data-dir.
//
//   tether-ckpt list   --data-dir DIRS
//   tether-ckpt show   --data-dir DIRS [--round R|latest] [--manifest-out F]
//   tether-ckpt verify --data-dir DIRS [--round R|latest]
//   tether-ckpt export --data-dir DIRS [--round R|latest]
//                      --format safetensors|npy --out PATH
//   tether-ckpt now    --coordinator HOST:PORT [--auth-key-file F]
//
// DIRS may also follow the command (`tether-ckpt list DIR`).
// DIRS is every shard's data dir, comma-separated, shard 0's first; or one
// directory holding shard0, shard1, ... (as tether-up lays them out).
// Complete rounds come from shard 0's records; list marks a recorded round
// INCOMPLETE when some shard no longer holds it. Stores are opened read-only,
// so a running shard is not disturbed.
//
// export assembles whole tensors from every shard's blocks; blocks no shard
// ever touched hold the tensor's initial values (from the run's seed). A
// sparse table becomes two arrays: NAME.keys (u64, ascending) and
// NAME.values (f32, [rows, dim]). safetensors writes one file; npy writes
// one NAME.npy per array into the directory --out.
//
// Exit status: 0 on success, 1 on errors and when verify finds problems,
// 2 for bad flags.
#include <algorithm>
#include <boost/json.hpp>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "schema/flags.h"
#include "schema/status.h"
#include "server/checkpoint.h"
#include "server/initializer.h"
#include "server/optimizer.h"
#include "server/param_store.h"
#include "server/round_merge.h"
#include "worker/client.h"

namespace tether {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;

constexpr const char* kSummary =
    "Inspects tether checkpoints. Commands:\n"
    "  list    rounds shard 0 recorded complete, and whether every shard\n"
    "          still holds them\n"
    "  show    a round's run settings, tensors, workers and run manifest\n"
    "  verify  checks that every shard holds the round, intact and finite\n"
    "  export  writes the round's tensors as safetensors or .npy files\n"
    "  now     asks a running cluster (--coordinator) for a round now\n"
    "The data dirs may follow the command: tether-ckpt list DIR";

struct CkptOptions {
  std::string data_dir;          // required
  std::string round = "latest";  // a round number or "latest"
  std::string format = "safetensors";
  std::string out;  // export: required
  // show: also write the round's run manifest (JSON) here, for
  // `tether-up --manifest`.
  std::string manifest_out;
};

int Fail(const Status& s) {
  std::cerr << "tether-ckpt: " << s.message() << "\n";
  return 1;
}

// --- Shards and rounds
// ----------------------------------------------------------

struct ShardDirs {
  std::vector<std::string> dirs;  // by shard id
  std::string parent;  // when given as one dir of shardN subdirs, else empty

  // Where shard `k`'s data dir is, or would be.
  std::string Dir(size_t k) const {
    if (k < dirs.size()) return dirs[k];
    if (!parent.empty()) return parent + "/shard" + std::to_string(k);
    return "(not given in --data-dir)";
  }
};

Result<ShardDirs> ResolveDirs(const std::string& flag) {
  ShardDirs out;
  std::stringstream in(flag);
  for (std::string dir; std::getline(in, dir, ',');) {
    if (dir.empty()) {
      return InvalidArgument("--data-dir: empty directory in '" + flag + "'");
    }
    out.dirs.push_back(dir);
  }
  if (out.dirs.empty()) return InvalidArgument("--data-dir is required");
  std::error_code ec;
  if (out.dirs.size() == 1 && fs::is_directory(out.dirs[0] + "/shard0", ec)) {
    out.parent = out.dirs[0];
    out.dirs.clear();
    for (size_t k = 0; fs::is_directory(out.Dir(k), ec); ++k) {
      out.dirs.push_back(out.Dir(k));
    }
  }
  return out;
}

std::string Where(int64_t round, size_t shard, const ShardDirs& dirs) {
  return "round " + std::to_string(round) + ": shard " + std::to_string(shard) +
         " (" + dirs.Dir(shard) + ")";
}

// Why shard 0's store records no complete round: it may be another
// shard's (the dirs given in the wrong order), which records none.
Status NoCompleteRound(const CheckpointStore& shard0) {
  Result<std::vector<int64_t>> held = shard0.ShardRounds();
  if (held.ok() && !held->empty()) {
    Result<ShardSnapshot> newest = shard0.ReadShard(held->back());
    if (newest.ok() && newest->shard_id != 0) {
      return InvalidArgument(
          shard0.dir() + " holds shard " + std::to_string(newest->shard_id) +
          "'s checkpoints, not shard 0's: --data-dir lists shard 0's "
          "directory first (shard 0 records which rounds are complete)");
    }
  }
  return NotFound("no complete round in " + shard0.dir());
}

// The record of round `spec` ("latest" or a number) among shard 0's.
Result<RoundRecord> FindRound(const CheckpointStore& shard0,
                              const std::string& spec) {
  TETHER_ASSIGN_OR_RETURN(std::vector<RoundRecord> records,
                          shard0.CompleteRounds());
  if (records.empty()) return NoCompleteRound(shard0);
  if (spec == "latest") return records.back();
  int64_t round = -1;
  std::istringstream parse(spec);
  if (!(parse >> round) || !parse.eof() || round < 0) {
    return InvalidArgument("--round: expected a round number or latest, got '" +
                           spec + "'");
  }
  std::string known;
  for (const RoundRecord& r : records) {
    if (r.round == round) return r;
    known += (known.empty() ? "" : ", ") + std::to_string(r.round);
  }
  return NotFound("round " + spec + " is not complete in " + shard0.dir() +
                  " (complete: " + known + ")");
}

// One shard's slice of a round, read and checked against the record.
Result<ShardSnapshot> ReadSlice(const ShardDirs& dirs, size_t k,
                                const RoundRecord& record) {
  const std::string where = Where(record.round, k, dirs);
  if (k >= dirs.dirs.size()) {
    return NotFound(where + ": no data dir (the run has " +
                    std::to_string(record.settings.num_shards) + " shards)");
  }
  Result<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::OpenReadOnly(dirs.dirs[k]);
  if (!store.ok()) return store.status().WithContext(where);
  Result<ShardSnapshot> slice = (*store)->ReadShard(record.round);
  if (!slice.ok()) return slice.status().WithContext(where);
  // The same check a resuming shard makes before it serves the slice.
  std::string mismatch =
      IdentityMismatch(*slice, static_cast<int>(k), record.settings);
  if (!mismatch.empty()) {
    return InvalidArgument(where +
                           ": not this shard's slice of the run shard 0 "
                           "recorded: " +
                           mismatch);
  }
  return slice;
}

// --- Assembling whole tensors -----------------------------------------------

// `def` points into Model::slices, which is filled before Assemble and
// never resized after (moving the Model keeps the elements in place).
struct DenseTensor {
  const TensorSnapshot* def = nullptr;  // the first shard's definition
  uint64_t num_blocks = 0;
  uint64_t held = 0;  // blocks some shard holds
  std::vector<float> values;
};

struct SparseTable {
  const TableSnapshot* def = nullptr;
  std::vector<uint64_t> keys;  // ascending
  std::vector<float> values;   // keys.size() * dim
};

struct Model {
  RoundRecord record;
  std::vector<ShardSnapshot> slices;  // by shard id
  std::map<std::string, DenseTensor> tensors;
  std::map<std::string, SparseTable> tables;
};

// Merges the slices (server/round_merge.h) into whole tensors and tables.
// Every inconsistency is appended to `problems` (the tensor is then left
// partly assembled).
void Assemble(const ShardDirs& dirs, Model* m,
              std::vector<std::string>* problems) {
  const int64_t round = m->record.round;
  const uint32_t block_size = m->record.settings.block_size;
  const uint64_t seed = m->record.settings.seed;
  const MergedRound merged = MergeSlices(
      m->slices, block_size, [&](size_t k) { return Where(round, k, dirs); },
      problems);
  for (const auto& [name, t] : merged.tensors) {
    DenseTensor& d = m->tensors[name];
    d.def = t.def;
    d.num_blocks = t.num_blocks;
    d.values.assign(t.numel, 0.0f);
    for (uint64_t b = 0; b < t.num_blocks; ++b) {
      const uint64_t begin = b * block_size;
      const uint64_t len = std::min<uint64_t>(block_size, t.numel - begin);
      const auto held = t.blocks.find(static_cast<uint32_t>(b));
      if (held == t.blocks.end()) {
        // Never touched: it still holds its initial values, a pure
        // function of the seed.
        FillInitial(t.def->init, seed, t.def->id, begin,
                    {d.values.data() + begin, len});
        continue;
      }
      const TensorSnapshot::Block* block = held->second.second;
      if (block == nullptr) continue;  // does not fit: a problem already
      std::copy(block->Weights().begin(), block->Weights().end(),
                d.values.begin() + begin);
      ++d.held;
    }
  }
  // Rows in key order, whichever shard holds them.
  for (const auto& [name, t] : merged.tables) {
    SparseTable& s = m->tables[name];
    s.def = t.def;
    for (const auto& [key, held] : t.rows) {
      const TableSnapshot::Row* row = held.second;
      if (row == nullptr) continue;
      s.keys.push_back(key);
      s.values.insert(s.values.end(), row->weights.begin(), row->weights.end());
    }
  }
}

// Reads round `spec` from every shard and assembles it; any problem is an
// error (show and export).
Result<Model> LoadModel(const ShardDirs& dirs, const std::string& spec) {
  TETHER_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> shard0,
                          CheckpointStore::OpenReadOnly(dirs.dirs[0]));
  TETHER_ASSIGN_OR_RETURN(RoundRecord record, FindRound(*shard0, spec));
  Model m;
  m.record = record;
  const size_t shards = std::max<size_t>(record.settings.num_shards, 1);
  for (size_t k = 0; k < shards; ++k) {
    TETHER_ASSIGN_OR_RETURN(ShardSnapshot slice, ReadSlice(dirs, k, m.record));
    m.slices.push_back(std::move(slice));
  }
  std::vector<std::string> problems;
  Assemble(dirs, &m, &problems);
  if (!problems.empty()) {
    std::string all = problems[0];
    if (problems.size() > 1) {
      all += " (and " + std::to_string(problems.size() - 1) + " more)";
    }
    return InvalidArgument(all);
  }
  return m;
}

// --- list, show -------------------------------------------------------------

std::string UtcTime(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// A round is complete only while every shard still holds its slice: shard
// 0's record alone does not make it loadable.
int RunList(const ShardDirs& dirs) {
  Result<std::unique_ptr<CheckpointStore>> shard0 =
      CheckpointStore::OpenReadOnly(dirs.dirs[0]);
  if (!shard0.ok()) return Fail(shard0.status());
  Result<std::vector<RoundRecord>> records = (*shard0)->CompleteRounds();
  if (!records.ok()) return Fail(records.status());
  if (records->empty()) {
    Status why = NoCompleteRound(**shard0);
    if (why.code() != Code::kNotFound) return Fail(why);
    std::cout << "no complete rounds in " << dirs.dirs[0] << "\n";
    return 0;
  }
  // Rounds each shard holds completely written, by shard id; a shard whose
  // directory is missing or unreadable holds none. Rounds before a resume
  // on another number of shards (--reshard-from) have another count.
  size_t shards = 0;
  for (const RoundRecord& r : *records) {
    shards = std::max(shards, static_cast<size_t>(r.settings.num_shards));
  }
  std::vector<std::set<int64_t>> held(shards);
  std::vector<std::string> problems(shards);
  for (size_t k = 0; k < shards; ++k) {
    if (k >= dirs.dirs.size()) {
      problems[k] = "not given in --data-dir";
      continue;
    }
    std::unique_ptr<CheckpointStore> other;
    if (k > 0) {
      auto opened = CheckpointStore::OpenReadOnly(dirs.dirs[k]);
      if (!opened.ok()) {
        problems[k] = opened.status().message();
        continue;
      }
      other = std::move(*opened);
    }
    const CheckpointStore& store = k == 0 ? **shard0 : *other;
    auto rounds = store.ShardRounds();
    if (!rounds.ok()) {
      problems[k] = rounds.status().message();
      continue;
    }
    held[k].insert(rounds->begin(), rounds->end());
  }
  std::cout << std::left << std::setw(8) << "round" << std::setw(10) << "clock"
            << std::setw(22) << "time (UTC)" << std::setw(14) << "bytes"
            << std::setw(9) << "workers"
            << "state\n";
  for (const RoundRecord& r : *records) {
    std::string state = "complete";
    for (size_t k = 0; k < static_cast<size_t>(r.settings.num_shards); ++k) {
      if (held[k].count(r.round) > 0) continue;
      state = "INCOMPLETE: shard " + std::to_string(k) +
              (problems[k].empty() ? " no longer holds it (pruned or lost)"
                                   : " unknown (" + problems[k] + ")");
      break;
    }
    std::cout << std::setw(8) << r.round << std::setw(10) << r.clock
              << std::setw(22) << UtcTime(r.unix_ms) << std::setw(14) << r.bytes
              << std::setw(9) << r.workers.size() << state << "\n";
  }
  return 0;
}

struct Stats {
  double sum_squares = 0;
  float min = 0, max = 0;
  uint64_t count = 0;

  void Add(std::span<const float> values) {
    for (float v : values) {
      if (count++ == 0) min = max = v;
      min = std::min(min, v);
      max = std::max(max, v);
      sum_squares += double{v} * v;
    }
  }
  std::string Text() const {
    std::ostringstream s;
    s << std::setprecision(6) << "l2 " << std::sqrt(sum_squares) << "  min "
      << min << "  max " << max;
    return s.str();
  }
};

// The run manifest (server/manifest.h) of a round, process by process.
void PrintManifest(const std::string& text) {
  if (text.empty()) return;
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) {
    std::cout << "manifest: unreadable\n";
    return;
  }
  auto str = [](const json::object& o, const char* key) -> std::string {
    const json::value* f = o.if_contains(key);
    if (f == nullptr || f->is_null()) return "?";
    if (f->is_string()) return std::string(f->get_string());
    return json::serialize(*f);
  };
  const json::object& m = v.as_object();
  std::cout << "manifest:\n";
  if (const json::value* t = m.if_contains("tether"); t && t->is_object()) {
    std::cout << "  tether " << str(t->as_object(), "version") << ", commit "
              << str(t->as_object(), "commit") << " (shard 0)\n";
  }
  auto each = [&](const char* key, const char* id, const char* what,
                  auto&& more) {
    const json::value* list = m.if_contains(key);
    if (list == nullptr || !list->is_array()) return;
    size_t i = 0;
    for (const json::value& e : list->as_array()) {
      if (!e.is_object()) {
        std::cout << "  " << what << " " << i << ": not known\n";
      } else {
        const json::object& p = e.as_object();
        std::cout << "  " << what << " " << str(p, id) << " on "
                  << str(p, "host") << ", tether " << str(p, "version") << " "
                  << str(p, "commit") << "\n";
        more(p);
        std::cout << "    command: " << str(p, "command") << "\n";
      }
      ++i;
    }
  };
  each("shards", "shard_id", "shard", [](const json::object&) {});
  each("workers", "rank", "worker", [&](const json::object& p) {
    if (const json::value* s = p.if_contains("settings"); s && s->is_object()) {
      std::cout << "    settings:";
      for (const auto& [k, val] : s->as_object()) {
        std::cout << " " << k << "=";
        if (val.is_string()) {
          std::cout << std::string(val.get_string());
        } else if (val.is_double()) {
          std::cout << val.get_double();
        } else {
          std::cout << json::serialize(val);
        }
      }
      std::cout << "\n";
    }
    if (const json::value* f = p.if_contains("data_files");
        f && f->is_array()) {
      for (const json::value& file : f->as_array()) {
        if (!file.is_object()) continue;
        const json::object& d = file.as_object();
        std::cout << "    data: " << str(d, "path") << " sha256 "
                  << (d.contains("sha256") ? str(d, "sha256")
                                           : "(" + str(d, "error") + ")")
                  << "\n";
      }
    }
  });
}

int RunShow(const ShardDirs& dirs, const CkptOptions& o) {
  Result<Model> m = LoadModel(dirs, o.round);
  if (!m.ok()) return Fail(m.status());
  const RoundRecord& r = m->record;
  const RunSettings& s = r.settings;
  const OptimizerOptions& opt = s.optimizer;
  std::cout << "round " << r.round << ": clock " << r.clock << ", completed "
            << UtcTime(r.unix_ms) << ", " << r.bytes << " bytes\n"
            << "run: seed " << s.seed << ", " << s.num_shards << " shards, "
            << s.num_workers << " workers, max staleness " << s.max_staleness
            << ", reject staleness " << s.reject_staleness << ", block size "
            << s.block_size << ", checkpoint every " << s.checkpoint_every
            << " clocks";
  if (s.resume_round >= 0) {
    std::cout << ", resumed from round " << s.resume_round;
  }
  std::cout << "\n"
            << "optimizer: " << OptimizerName(opt.kind) << " lr " << opt.lr
            << " momentum " << opt.momentum << " beta1 " << opt.beta1
            << " beta2 " << opt.beta2 << " epsilon " << opt.epsilon << "\n";
  std::cout << "tensors:\n";
  for (const auto& [name, d] : m->tensors) {
    Stats stats;
    stats.Add(d.values);
    std::cout << "  " << name << "  " << ShapeString(d.def->shape) << "  "
              << InitString(d.def->init) << "  blocks " << d.held << "/"
              << d.num_blocks << " held  " << stats.Text() << "\n";
  }
  if (!m->tables.empty()) std::cout << "tables:\n";
  for (const auto& [name, t] : m->tables) {
    Stats stats;
    stats.Add(t.values);
    std::cout << "  " << name << "  dim " << t.def->dim << "  "
              << InitString(t.def->init) << "  rows " << t.keys.size() << "  "
              << stats.Text() << "\n";
  }
  std::cout << "workers:\n";
  for (const WorkerPosition& w : r.workers) {
    std::cout << "  rank " << w.rank << ": clock " << w.clock << ", epoch "
              << w.epoch << ", samples " << w.samples << "\n";
  }
  PrintManifest(r.manifest);
  if (!o.manifest_out.empty()) {
    if (r.manifest.empty()) {
      return Fail(NotFound("--manifest-out: round " + std::to_string(r.round) +
                           " holds no run manifest (written before tether "
                           "kept them)"));
    }
    std::ofstream out(o.manifest_out, std::ios::trunc);
    out << r.manifest << "\n";
    out.close();
    if (!out) {
      return Fail(Status(Code::kIoError,
                         "--manifest-out " + o.manifest_out + ": not written"));
    }
    std::cout << "manifest written to " << o.manifest_out << "\n";
  }
  return 0;
}

// --- verify ------------------------------------------------------------------

// Problems with the values of one block or row: non-finite weights or slots.
void CheckFinite(const std::string& what, std::span<const float> weights,
                 std::span<const float> slots,
                 std::vector<std::string>* problems) {
  for (const auto* values : {&weights, &slots}) {
    uint64_t bad = 0, first = 0;
    for (size_t i = 0; i < values->size(); ++i) {
      if (std::isfinite((*values)[i])) continue;
      if (bad++ == 0) first = i;
    }
    if (bad == 0) continue;
    std::ostringstream s;
    s << what << ": " << bad << " non-finite "
      << (values == &weights ? "weights" : "optimizer slots") << " (first at "
      << first << ": " << (*values)[first] << ")";
    problems->push_back(s.str());
  }
}

int RunVerify(const ShardDirs& dirs, const CkptOptions& o) {
  Result<std::unique_ptr<CheckpointStore>> shard0 =
      CheckpointStore::OpenReadOnly(dirs.dirs[0]);
  if (!shard0.ok()) return Fail(shard0.status());
  Result<RoundRecord> record = FindRound(**shard0, o.round);
  if (!record.ok()) return Fail(record.status());
  shard0->reset();

  Model m;
  m.record = *record;
  const int64_t round = record->round;
  const size_t shards = std::max<size_t>(record->settings.num_shards, 1);
  std::vector<std::string> problems;
  bool all_read = true;
  for (size_t k = 0; k < shards; ++k) {
    Result<ShardSnapshot> slice = ReadSlice(dirs, k, m.record);
    if (slice.ok()) {
      m.slices.push_back(std::move(*slice));
    } else {
      all_read = false;
      problems.push_back(slice.status().message());
      m.slices.emplace_back();  // keeps shard ids as indices
    }
  }
  // A dir of shardN dirs may hold more than the round's count: the run
  // was resharded (--reshard-from) onto more shards since.
  for (size_t k = shards; dirs.parent.empty() && k < dirs.dirs.size(); ++k) {
    problems.push_back(Where(round, k, dirs) + ": the run has only " +
                       std::to_string(shards) + " shards");
  }
  Assemble(dirs, &m, &problems);
  uint64_t blocks = 0, rows = 0;
  for (size_t k = 0; k < m.slices.size(); ++k) {
    const std::string where = Where(round, k, dirs);
    for (const TensorSnapshot& t : m.slices[k].tensors) {
      for (const TensorSnapshot::Block& b : t.blocks) {
        CheckFinite(where + ": tensor '" + t.name + "' block " +
                        std::to_string(b.index),
                    b.Weights(), b.Slots(), &problems);
      }
    }
    for (const TableSnapshot& t : m.slices[k].tables) {
      for (const TableSnapshot::Row& r : t.rows) {
        CheckFinite(
            where + ": table '" + t.name + "' row " + std::to_string(r.key),
            r.weights, r.slots, &problems);
      }
    }
  }
  for (const auto& [name, d] : m.tensors) {
    blocks += d.held;
    // Blocks are created on first touch, so one that no worker ever pulled
    // or pushed is held by no shard: not damage, and export fills it with
    // its initial values. Worth knowing, not failing.
    if (all_read && d.held < d.num_blocks) {
      std::cout << "round " << round << ": note: tensor '" << name
                << "': " << d.num_blocks - d.held << " of " << d.num_blocks
                << " blocks were never touched (initial values)\n";
    }
  }
  for (const auto& [name, t] : m.tables) rows += t.keys.size();
  for (const std::string& p : problems) std::cout << p << "\n";
  if (!problems.empty()) {
    std::cout << "round " << round << ": " << problems.size()
              << " problem(s)\n";
    return 1;
  }
  std::cout << "round " << round << ": OK (" << shards << " shards, "
            << m.tensors.size() << " tensors, " << blocks << " blocks, "
            << m.tables.size() << " tables, " << rows << " rows)\n";
  return 0;
}

// --- export
// --------------------------------------------------------------------

// One array to write: a tensor, or a table's keys or values.
struct Array {
  std::string name;
  const char* dtype;  // safetensors dtype: "F32" or "U64"
  std::vector<uint64_t> shape;
  const char* data;
  uint64_t bytes;
};

Result<std::vector<Array>> Arrays(const Model& m) {
  std::map<std::string, Array> by_name;
  auto add = [&](Array a) -> Status {
    const std::string name = a.name;
    if (!by_name.emplace(name, std::move(a)).second) {
      return InvalidArgument("two arrays would be named '" + name + "'");
    }
    return Status::Ok();
  };
  for (const auto& [name, d] : m.tensors) {
    TETHER_RETURN_IF_ERROR(add({name, "F32", d.def->shape,
                                reinterpret_cast<const char*>(d.values.data()),
                                d.values.size() * sizeof(float)}));
  }
  for (const auto& [name, t] : m.tables) {
    TETHER_RETURN_IF_ERROR(add({name + ".keys",
                                "U64",
                                {t.keys.size()},
                                reinterpret_cast<const char*>(t.keys.data()),
                                t.keys.size() * sizeof(uint64_t)}));
    TETHER_RETURN_IF_ERROR(add({name + ".values",
                                "F32",
                                {t.keys.size(), t.def->dim},
                                reinterpret_cast<const char*>(t.values.data()),
                                t.values.size() * sizeof(float)}));
  }
  std::vector<Array> out;
  out.reserve(by_name.size());
  for (auto& [name, a] : by_name) out.push_back(std::move(a));
  return out;
}

Status WriteOrFail(std::ofstream& out, const std::string& path) {
  if (!out) {
    return Status(Code::kIoError,
                  path + ": write failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

Status WriteSafetensors(const Model& m, const std::vector<Array>& arrays,
                        const std::string& path) {
  json::object header;
  uint64_t offset = 0;
  for (const Array& a : arrays) {
    json::array shape;
    for (uint64_t d : a.shape) shape.push_back(d);
    header[a.name] = json::object{{"dtype", a.dtype},
                                  {"shape", std::move(shape)},
                                  {"data_offsets", {offset, offset + a.bytes}}};
    offset += a.bytes;
  }
  header["__metadata__"] =
      json::object{{"round", std::to_string(m.record.round)},
                   {"clock", std::to_string(m.record.clock)},
                   {"seed", std::to_string(m.record.settings.seed)}};
  std::string text = json::serialize(header);
  // Readers expect the data to start 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return Status(Code::kIoError,
                  path + ": cannot create: " + std::strerror(errno));
  }
  const uint64_t size = text.size();  // little endian, as on every host we run
  out.write(reinterpret_cast<const char*>(&size), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Array& a : arrays) {
    out.write(a.data, static_cast<std::streamsize>(a.bytes));
  }
  out.flush();
  return WriteOrFail(out, path);
}

// Array names may hold '/' and such; file names keep [A-Za-z0-9._-].
std::string FileName(const std::string& name) {
  std::string f = name;
  for (char& c : f) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '-') {
      c = '_';
    }
  }
  return f + ".npy";
}

Status WriteNpy(const std::vector<Array>& arrays, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return Status(Code::kIoError, dir + ": cannot create: " + ec.message());
  }
  std::set<std::string> files;
  for (const Array& a : arrays) {
    const std::string file = FileName(a.name);
    if (!files.insert(file).second) {
      return InvalidArgument("arrays '" + a.name +
                             "' and another would both be written to " + file);
    }
  }
  for (const Array& a : arrays) {
    const std::string path = dir + "/" + FileName(a.name);
    std::string shape = "(";
    for (uint64_t d : a.shape) shape += std::to_string(d) + ", ";
    if (a.shape.size() > 1) shape.resize(shape.size() - 2);
    if (a.shape.size() == 1) shape.resize(shape.size() - 1);
    shape += ")";
    std::string header = std::string("{'descr': '") +
                         (std::string(a.dtype) == "F32" ? "<f4" : "<u8") +
                         "', 'fortran_order': False, 'shape': " + shape + ", }";
    // Format 1.0: magic, version, u16 header length; the header ends in a
    // newline and pads the total to a multiple of 64.
    const size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    if (header.size() > 65535) {
      return InvalidArgument(a.name + ": shape too long for an .npy header");
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) {
      return Status(Code::kIoError,
                    path + ": cannot create: " + std::strerror(errno));
    }
    const unsigned char prefix[10] = {
        0x93,
        'N',
        'U',
        'M',
        'P',
        'Y',
        1,
        0,
        static_cast<unsigned char>(header.size() & 0xff),
        static_cast<unsigned char>(header.size() >> 8)};
    out.write(reinterpret_cast<const char*>(prefix), 10);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(a.data, static_cast<std::streamsize>(a.bytes));
    out.flush();
    TETHER_RETURN_IF_ERROR(WriteOrFail(out, path));
  }
  return Status::Ok();
}

// `o.out` and `o.format` are checked by Main.
int RunExport(const ShardDirs& dirs, const CkptOptions& o) {
  Result<Model> m = LoadModel(dirs, o.round);
  if (!m.ok()) return Fail(m.status());
  Result<std::vector<Array>> arrays = Arrays(*m);
  if (!arrays.ok()) return Fail(arrays.status());
  Status s = o.format == "safetensors" ? WriteSafetensors(*m, *arrays, o.out)
                                       : WriteNpy(*arrays, o.out);
  if (!s.ok()) return Fail(s);
  std::cout << "round " << m->record.round << ": wrote " << arrays->size()
            << " arrays to " << o.out << "\n";
  return 0;
}

// Asks a running cluster's shard 0 for a round now.
int RunNow(const std::string& coordinator, const std::string& key_file) {
  if (coordinator.empty()) {
    return Fail(InvalidArgument("now needs --coordinator HOST:PORT"));
  }
  ClientOptions co;
  co.coordinator = coordinator;
  co.auth_key_file = key_file;
  co.observer = true;
  co.name = "tether-ckpt now";
  auto client = Client::Connect(co);
  if (!client.ok()) return Fail(client.status());
  auto round = (*client)->CheckpointNow();
  if (!round.ok()) return Fail(round.status());
  std::cout << "round " << *round
            << " started; `tether-ckpt list` shows it once every shard has "
               "written it\n";
  return 0;
}

int Main(int argc, char** argv) {
  CkptOptions o;
  std::string coordinator;
  std::string key_file;
  FlagParser p("tether-ckpt COMMAND", kSummary);
  p.AddString("data-dir", &o.data_dir,
              "the shards' data dirs, comma-separated, shard 0's first; or "
              "one dir holding shard0, shard1, ...");
  p.AddString("round", &o.round, "show, verify, export: a round or latest");
  p.AddString("coordinator", &coordinator, "now: HOST:PORT of shard 0");
  p.AddString("auth-key-file", &key_file,
              "now: file holding the run's shared key, when it has one");
  p.AddString("format", &o.format, "export: safetensors or npy");
  p.AddString("manifest-out", &o.manifest_out,
              "show: also write the round's run manifest (JSON) to this file, "
              "for tether-up --manifest");
  p.AddString("out", &o.out,
              "export: the .safetensors file, or the directory for .npy files");
  if (auto exit_code =
          p.ParseForMain(argc, argv, /*positional_allowed=*/true)) {
    return *exit_code;
  }
  const std::set<std::string> commands = {"list", "show", "verify", "export",
                                          "now"};
  const std::vector<std::string>& args = p.positional();
  if (args.empty() || args.size() > 2 || commands.count(args[0]) == 0) {
    std::cerr << "tether-ckpt: expected one command: list, show, verify, "
                 "export or now, then the data dirs unless --data-dir gives "
                 "them; see --help\n";
    return 2;
  }
  const std::string& command = args[0];
  if (command == "now") return RunNow(coordinator, key_file);
  if (args.size() == 2) {  // tether-ckpt list DIR
    if (!o.data_dir.empty()) {
      std::cerr << "tether-ckpt: the data dirs are given twice: '" << args[1]
                << "' and --data-dir '" << o.data_dir << "'\n";
      return 2;
    }
    o.data_dir = args[1];
  }
  if (command == "export" && o.out.empty()) {
    std::cerr << "tether-ckpt: export needs --out (a .safetensors file, or "
                 "a directory for .npy files)\n";
    return 2;
  }
  if (command == "export" && o.format != "safetensors" && o.format != "npy") {
    std::cerr << "tether-ckpt: --format: expected safetensors or npy, got '"
              << o.format << "'\n";
    return 2;
  }
  Result<ShardDirs> dirs = ResolveDirs(o.data_dir);
  if (!dirs.ok()) {
    std::cerr << "tether-ckpt: " << dirs.status().message() << "\n";
    return 2;
  }
  if (dirs->dirs.empty()) {
    return Fail(NotFound(o.data_dir + ": no shard0 directory"));
  }
  // Shard 0's records say what the others should hold (list and verify
  // name a missing other shard per round).
  std::error_code ec;
  if (!fs::is_directory(dirs->dirs[0], ec)) {
    return Fail(NotFound(dirs->dirs[0] +
                         ": no such directory (--data-dir takes every "
                         "shard's data dir, shard 0's first, or the dir "
                         "holding shard0, shard1, ...)"));
  }
  if (command == "list") return RunList(*dirs);
  if (command == "show") return RunShow(*dirs, o);
  if (command == "verify") return RunVerify(*dirs, o);
  return RunExport(*dirs, o);
}

}  // namespace
}  // namespace tether

int main(int argc, char** argv) { return tether::Main(argc, argv); }
