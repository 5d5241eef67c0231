#include "server/reproduce.h"

#include <set>

#include "schema/flags.h"

namespace tether {
namespace {

// Shard 0's run-wide flags from the settings, every one written out so that
// the copy does not depend on the defaults of another version.
std::vector<std::string> RunFlags(const RunSettings& s) {
  std::vector<std::string> out;
  auto flag = [&out](const char* name, std::string value) {
    out.push_back(name);
    out.push_back(std::move(value));
  };
  flag("--shard-id", "0");
  flag("--shards", std::to_string(s.num_shards));
  flag("--workers", std::to_string(s.num_workers));
  flag("--seed", std::to_string(s.seed));
  flag("--max-staleness", std::to_string(s.max_staleness));
  flag("--reject-staleness", std::to_string(s.reject_staleness));
  flag("--block-size", std::to_string(s.block_size));
  flag("--optimizer", OptimizerName(s.optimizer.kind));
  flag("--lr", NumberText(s.optimizer.lr));
  flag("--momentum", NumberText(s.optimizer.momentum));
  flag("--beta1", NumberText(s.optimizer.beta1));
  flag("--beta2", NumberText(s.optimizer.beta2));
  flag("--epsilon", NumberText(s.optimizer.epsilon));
  flag("--worker-timeout-ms", std::to_string(s.worker_timeout_ms));
  flag("--heartbeat-ms", std::to_string(s.heartbeat_ms));
  flag("--backup-workers", std::to_string(s.backup_workers));
  if (s.staleness_lr) out.push_back("--staleness-lr");
  if (s.checkpoint_every > 0) {
    flag("--checkpoint-every", std::to_string(s.checkpoint_every));
  }
  if (s.checkpoint_every > 0 ||
      s.keep_checkpoints != RunSettings{}.keep_checkpoints) {
    flag("--keep-checkpoints", std::to_string(s.keep_checkpoints));
  }
  return out;
}

// Whether RunFlags may write flag `name` (without "--"): shard 0's own
// value of it gives way to the settings'.
bool FromSettings(const std::string& name) {
  static const std::set<std::string> names = [] {
    RunSettings every;  // one that makes RunFlags write every flag
    every.staleness_lr = true;
    every.checkpoint_every = 1;
    std::set<std::string> out;
    for (const std::string& word : RunFlags(every)) {
      if (word.rfind("--", 0) == 0) out.insert(word.substr(2));
    }
    return out;
  }();
  return names.count(name) > 0;
}

bool PicksPort(const std::string& listen) {
  auto hp = ParseHostPort(listen, "--listen", /*allow_zero_port=*/true);
  return hp.ok() && hp->port == 0;
}

}  // namespace

std::string ReproduceCommand(const RunSettings& settings) {
  std::vector<std::string> argv = {"tether-server"};
  for (std::string& flag : RunFlags(settings)) argv.push_back(std::move(flag));
  if (settings.checkpoint_every > 0) {
    argv.insert(argv.end(), {"--data-dir", "DIR"});
  }
  return ShellCommand(argv);
}

std::string ShardCommand(const std::vector<std::string>& argv,
                         const std::string& bound,
                         const RunSettings* settings) {
  if (argv.empty()) return settings ? ReproduceCommand(*settings) : "";
  std::vector<std::string> out = {argv[0]};
  if (settings) {
    for (std::string& flag : RunFlags(*settings)) {
      out.push_back(std::move(flag));
    }
  }
  // A flag's value never starts with "--" (FlagParser refuses that), so the
  // word after a valued flag is its value.
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& word = argv[i];
    if (word == "--") {
      out.insert(out.end(), argv.begin() + i, argv.end());
      break;
    }
    if (word.rfind("--", 0) != 0) {
      out.push_back(word);
      continue;
    }
    const size_t eq = word.find('=');
    const std::string name = word.substr(2, eq - 2);
    const bool inline_value = eq != std::string::npos;
    const bool takes_next = !inline_value && name != "staleness-lr" &&
                            i + 1 < argv.size() &&
                            argv[i + 1].rfind("--", 0) != 0;
    // A copy starts the run afresh: not from a round.
    const bool drop = name == "resume" || (settings && FromSettings(name));
    if (drop) {
      if (takes_next) ++i;
      continue;
    }
    if (name == "listen" && !bound.empty()) {
      const std::string value = inline_value ? word.substr(eq + 1)
                                : takes_next ? argv[i + 1]
                                             : "";
      if (PicksPort(value)) {
        out.insert(out.end(), {"--listen", bound});
        if (takes_next) ++i;
        continue;
      }
    }
    out.push_back(word);
  }
  return ShellCommand(out);
}

std::string RunScript(const std::vector<ProcessCommand>& commands) {
  std::string out;
  for (const ProcessCommand& p : commands) {
    if (p.command.empty()) {
      out += "# " + p.process +
             ": command not known (not joined yet, or its client does not "
             "say)\n";
    } else {
      out += p.command + " &\n";
    }
  }
  return out + "wait";
}

}  // namespace tether
