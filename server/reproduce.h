// The command lines that start a run's processes again: what the
// dashboard's "Copy command + seeds" copies (web/API.md, config). Pure
// functions of their arguments; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "server/run_settings.h"

namespace tether {

// The tether-server command line for shard 0 that starts a run with
// these settings (the other shards take them from it), when shard 0's own
// command line is not known.
std::string ReproduceCommand(const RunSettings& settings);

// A shard's command line that starts it again in a copy of the run:
// `argv` (how it was started; argv[0] the program) shell-quoted, less
// --resume (the copy starts afresh), with --listen set to `bound` (where
// it listens) when it asked for port 0, since the others' --coordinator
// name that port. With `settings` (shard 0's), the run-wide flags come
// from them, not from argv: a resumed run goes on with its round's.
// ReproduceCommand(*settings) when argv is empty.
std::string ShardCommand(const std::vector<std::string>& argv,
                         const std::string& bound,
                         const RunSettings* settings = nullptr);

// One process of the run and how to start it; `command` "" when not known.
struct ProcessCommand {
  std::string process;  // "shard 1", "worker 0"
  std::string command;
};

// The whole run as one shell script: a line per process, each started in
// the background (" &"), shards first, then `wait`. A process whose
// command is not known is a comment line saying so.
std::string RunScript(const std::vector<ProcessCommand>& commands);

}  // namespace tether
