#include "server/manifest.h"

#include <boost/json.hpp>

#include "schema/build_info.h"
#include "schema/provenance.h"
#include "server/checkpoint_codec.h"

namespace tether {

namespace json = boost::json;

std::string ShardManifest(const std::vector<std::string>& argv) {
  json::array args;
  for (const std::string& a : argv) args.push_back(json::value(a));
  return json::serialize(json::object{{"program", "tether-server"},
                                      {"version", TetherVersion()},
                                      {"commit", TetherCommit()},
                                      {"host", HostName()},
                                      {"argv", std::move(args)}});
}

RunManifest::RunManifest(RunSettings settings)
    : settings_(std::move(settings)) {}

void RunManifest::SetShard(int shard_id, const std::string& part,
                           const std::string& command) {
  Set(/*shard=*/true, shard_id, part, command);
}

void RunManifest::SetWorker(int rank, const std::string& part,
                            const std::string& command) {
  Set(/*shard=*/false, rank, part, command);
}

void RunManifest::Set(bool shard, int index, const std::string& part,
                      const std::string& command) {
  if (index < 0 || index >= kMaxRanks) return;
  // What a peer says is kept, within reason.
  constexpr size_t kMaxPartBytes = 64 * 1024;
  if (part.size() > kMaxPartBytes || command.size() > kMaxPartBytes) {
    return Set(shard, index,
               R"({"error": "a manifest longer than shard 0 keeps"})", "");
  }
  {
    MutexLock lock(&mu_);
    std::vector<Entry>& list = shard ? shards_ : workers_;
    if (list.size() <= static_cast<size_t>(index)) list.resize(index + 1);
    Entry& e = list[index];
    if (e.known && e.part == part && e.command == command) return;
    e = {part, command, true};
  }
  Publish();
}

void RunManifest::Publish() {
  MutexLock publishing(&publish_mu_);
  std::function<void(const std::string&)> changed;
  std::string whole;
  {
    MutexLock lock(&mu_);
    changed = changed_;
    if (changed) whole = JsonLocked();
  }
  if (changed) changed(whole);
}

void RunManifest::OnChange(std::function<void(const std::string&)> changed) {
  {
    MutexLock lock(&mu_);
    changed_ = std::move(changed);
  }
  Publish();
}

std::string RunManifest::Json() const {
  MutexLock lock(&mu_);
  return JsonLocked();
}

std::string RunManifest::JsonLocked() const {
  auto list = [](const std::vector<Entry>& entries, const char* key,
                 size_t at_least) {
    json::array out;
    for (size_t i = 0; i < std::max(entries.size(), at_least); ++i) {
      if (i >= entries.size() || !entries[i].known) {
        out.push_back(nullptr);
        continue;
      }
      boost::system::error_code ec;
      json::value part = json::parse(entries[i].part, ec);
      json::object o;
      if (!ec && part.is_object()) o = std::move(part.as_object());
      o[key] = static_cast<int64_t>(i);
      o["command"] = entries[i].command;
      out.push_back(std::move(o));
    }
    return out;
  };
  json::object whole{
      {"format", kManifestFormat},
      {"tether",
       json::object{{"version", TetherVersion()}, {"commit", TetherCommit()}}},
      {"run", checkpoint::SettingsToJson(settings_)},
      {"shards", list(shards_, "shard_id", settings_.num_shards)},
      {"workers", list(workers_, "rank", settings_.num_workers)}};
  return json::serialize(whole);
}

}  // namespace tether
