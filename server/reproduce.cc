#include "server/reproduce.h"

#include <type_traits>

#include "schema/flags.h"
#include "server/settings_fields.h"

namespace tether {
namespace {

// Shard 0's run-wide flags from the settings, every one written out (but
// those kOmitAtDefault at their defaults, and bools that are off) so that
// the copy does not depend on the defaults of another version.
std::vector<std::string> RunFlags(const RunSettings& s) {
  std::vector<std::string> out = {"--shard-id", "0"};
  for (std::string& flag : SettingFlags(
           s, [](const SettingField&) { return true; },
           AtDefault::kOmittedWhereMarked)) {
    out.push_back(std::move(flag));
  }
  return out;
}

// Whether RunFlags may write flag `name` (without "--"): shard 0's own
// value of it gives way to the settings'.
bool FromSettings(const std::string& name) {
  return name == "shard-id" || FindSettingFlag(name) != nullptr;
}

// Whether flag `name` (without "--") of argv is a setting's that takes no
// value.
bool IsBoolSetting(const std::string& name) {
  bool is_bool = false;
  const RunSettings s;
  ForEachSetting(s, [&](const SettingField& field, const auto& value) {
    if (field.flag == name) {
      is_bool = std::is_same_v<std::remove_cvref_t<decltype(value)>, bool>;
    }
  });
  return is_bool;
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
    const bool takes_next = !inline_value && !IsBoolSetting(name) &&
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
