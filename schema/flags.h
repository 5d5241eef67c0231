// Command-line flags for tether's programs: `--name value` or `--name=value`,
// bare `--name` for booleans. Each flag writes into a field of an options
// struct whose default is the documented default. Errors name the flag.
// Not thread-safe; use from main() only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "schema/status.h"

namespace tether {

// "HOST:PORT" (host may be a name, IPv4, or [IPv6]).
struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;
};

// Parses "HOST:PORT"; port 0 is allowed only when `allow_zero_port`.
// Errors mention `what` (a flag name or peer description).
Result<HostPort> ParseHostPort(const std::string& text, const std::string& what,
                               bool allow_zero_port = false);

// Parses layer widths written "256,128" (each 1 to 2^20; "" is none).
// Errors name `flag` and quote `text`.
Result<std::vector<int>> ParseWidths(const std::string& text,
                                     const std::string& flag);

// `value` as the shortest text that reads back as the same double
// ("0.001", "1e-07", "3"): for numbers one tool hands to another process,
// where std::to_string would round 1e-7 to "0.000000".
std::string NumberText(double value);
// The same for a float: the shortest text that reads back as the same float
// ("0.001", not the double 0.0010000000474974513).
std::string NumberText(float value);

// `word` as one shell word: as it is when it holds only characters no shell
// treats specially, else in single quotes (a quote inside as '\'').
std::string ShellQuote(std::string_view word);
// A command line (argv[0..argc)) as one line of shell words, for a process
// to say how it was started (schema/tether.fbs Hello.command).
std::string ShellCommand(int argc, const char* const* argv);
std::string ShellCommand(const std::vector<std::string>& argv);

class FlagParser {
 public:
  // `program` and `summary` head the usage text.
  FlagParser(std::string program, std::string summary);

  void AddString(const std::string& name, std::string* target,
                 const std::string& help);
  void AddInt(const std::string& name, int* target, const std::string& help);
  void AddInt64(const std::string& name, int64_t* target,
                const std::string& help);
  void AddUint64(const std::string& name, uint64_t* target,
                 const std::string& help);
  void AddUint32(const std::string& name, uint32_t* target,
                 const std::string& help);
  void AddDouble(const std::string& name, double* target,
                 const std::string& help);
  void AddFloat(const std::string& name, float* target,
                const std::string& help);
  void AddBool(const std::string& name, bool* target, const std::string& help);
  // A flag of another type: `set` parses the text given into its target,
  // returning kInvalidArgument naming the flag when it does not parse;
  // `default_text` is the usage's default.
  void AddCustom(const std::string& name, const std::string& help,
                 const std::string& default_text,
                 std::function<Status(const std::string&)> set);

  // Parses argv[1..]. Non-flag arguments are collected in positional().
  // Returns kInvalidArgument naming the flag for an unknown flag, a missing
  // value or a value of the wrong type. `--help` (or `-h`) sets
  // help_requested().
  Status Parse(int argc, const char* const* argv);

  // Parse() for a main(): on --help prints the usage to stdout (exit code
  // 0), on an error prints "<program>: <message>" to stderr (exit code 2),
  // and on unexpected positional arguments when `positional_allowed` is
  // false, likewise 2. Returns the exit code, or nullopt to go on.
  std::optional<int> ParseForMain(int argc, const char* const* argv,
                                  bool positional_allowed = false);

  // Every flag may also be given as the environment variable `prefix`
  // followed by its name in upper case with '-' as '_' (with "TETHER_",
  // --shard-id is TETHER_SHARD_ID), as Kubernetes and Slurm hand settings
  // to a process. A flag on the command line wins over its variable.
  // Parse reads the variables after argv; errors name the variable and the
  // flag. Call before Parse.
  void UseEnvironment(std::string prefix) { env_prefix_ = std::move(prefix); }
  // The variable that stands for `flag` ("" without UseEnvironment).
  std::string EnvironmentName(const std::string& flag) const;
  // Flags whose value came from the environment, in flag order.
  const std::vector<std::string>& from_environment() const {
    return from_environment_;
  }

  bool help_requested() const { return help_requested_; }
  bool WasSet(const std::string& name) const { return set_.count(name) > 0; }
  const std::vector<std::string>& positional() const { return positional_; }

  // The usage text: summary, then every flag with its help and default.
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<Status(const std::string&)> set;
  };
  void Add(Flag flag);

  std::string program_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::set<std::string> set_;
  std::vector<std::string> positional_;
  std::string env_prefix_;
  std::vector<std::string> from_environment_;
  bool help_requested_ = false;
};

}  // namespace tether
