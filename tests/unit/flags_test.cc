#include "schema/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

namespace tether {
namespace {

// gtest's own substring predicates, so that the tests need no gmock.
#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, needle, haystack)
#define EXPECT_NOT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::testing::IsNotSubstring, needle, haystack)

// Parses `args` as argv[1..] of a program called "prog".
Status ParseArgs(FlagParser& parser, std::vector<std::string> args) {
  std::vector<const char*> argv = {"prog"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parser.Parse(static_cast<int>(argv.size()), argv.data());
}

// The options struct of a typical tether program, with its defaults.
struct Options {
  std::string name = "default-name";
  int port = 8080;
  int64_t seed = -7;
  uint64_t budget = 100;
  double lr = 0.5;
  float momentum = 0.25f;
  bool verbose = false;
};

class Flags : public ::testing::Test {
 protected:
  Flags() : parser_("prog", "Runs a test program.") {
    parser_.AddString("name", &opts_.name, "the name");
    parser_.AddInt("port", &opts_.port, "port to listen on");
    parser_.AddInt64("seed", &opts_.seed, "random seed");
    parser_.AddUint64("budget", &opts_.budget, "byte budget");
    parser_.AddDouble("lr", &opts_.lr, "learning rate");
    parser_.AddFloat("momentum", &opts_.momentum, "momentum");
    parser_.AddBool("verbose", &opts_.verbose, "log more");
  }

  Options opts_;
  FlagParser parser_;
};

TEST_F(Flags, NoArgumentsKeepDefaults) {
  ASSERT_TRUE(ParseArgs(parser_, {}).ok());
  Options defaults;
  EXPECT_EQ(opts_.name, defaults.name);
  EXPECT_EQ(opts_.port, defaults.port);
  EXPECT_EQ(opts_.seed, defaults.seed);
  EXPECT_EQ(opts_.budget, defaults.budget);
  EXPECT_EQ(opts_.lr, defaults.lr);
  EXPECT_EQ(opts_.momentum, defaults.momentum);
  EXPECT_EQ(opts_.verbose, defaults.verbose);
  EXPECT_FALSE(parser_.help_requested());
  EXPECT_TRUE(parser_.positional().empty());
  EXPECT_FALSE(parser_.WasSet("port"));
}

TEST_F(Flags, EqualsAndSpaceFormsBoth) {
  Status s = ParseArgs(parser_, {"--name=alpha", "--port", "9000", "--seed=-3",
                                 "--lr", "0.125"});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(opts_.name, "alpha");
  EXPECT_EQ(opts_.port, 9000);
  EXPECT_EQ(opts_.seed, -3);
  EXPECT_EQ(opts_.lr, 0.125);
}

TEST_F(Flags, EveryTypeParses) {
  Status s = ParseArgs(
      parser_, {"--name", "beta", "--port=1", "--seed", "-9223372036854775808",
                "--budget", "18446744073709551615", "--lr=1e-3", "--momentum",
                "0.9", "--verbose"});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(opts_.name, "beta");
  EXPECT_EQ(opts_.port, 1);
  EXPECT_EQ(opts_.seed, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(opts_.budget, std::numeric_limits<uint64_t>::max());
  EXPECT_DOUBLE_EQ(opts_.lr, 1e-3);
  EXPECT_FLOAT_EQ(opts_.momentum, 0.9f);
  EXPECT_TRUE(opts_.verbose);
}

TEST_F(Flags, NegativeNumberIsAValueNotAFlag) {
  ASSERT_TRUE(ParseArgs(parser_, {"--seed", "-5", "--lr", "-0.5"}).ok());
  EXPECT_EQ(opts_.seed, -5);
  EXPECT_EQ(opts_.lr, -0.5);
}

TEST_F(Flags, ValueAfterEqualsKeepsFurtherEquals) {
  ASSERT_TRUE(ParseArgs(parser_, {"--name=a=b"}).ok());
  EXPECT_EQ(opts_.name, "a=b");
}

TEST_F(Flags, EmptyStringValueAllowed) {
  ASSERT_TRUE(ParseArgs(parser_, {"--name="}).ok());
  EXPECT_EQ(opts_.name, "");
  EXPECT_TRUE(parser_.WasSet("name"));
}

TEST_F(Flags, LaterOccurrenceWins) {
  ASSERT_TRUE(ParseArgs(parser_, {"--port=1", "--port=2"}).ok());
  EXPECT_EQ(opts_.port, 2);
}

TEST_F(Flags, WasSetOnlyForFlagsGiven) {
  ASSERT_TRUE(ParseArgs(parser_, {"--port", "8080", "--verbose"}).ok());
  EXPECT_TRUE(parser_.WasSet("port")) << "set even when equal to the default";
  EXPECT_TRUE(parser_.WasSet("verbose"));
  EXPECT_FALSE(parser_.WasSet("name"));
  EXPECT_FALSE(parser_.WasSet("lr"));
}

TEST_F(Flags, UnknownFlagIsNamed) {
  Status s = ParseArgs(parser_, {"--port=1", "--bogus", "3"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "unknown flag --bogus");
  EXPECT_CONTAINS(s.message(), "prog --help");
}

TEST_F(Flags, UnknownFlagWithEqualsNamesOnlyTheFlag) {
  Status s = ParseArgs(parser_, {"--bogus=3"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "--bogus ");
  EXPECT_NOT_CONTAINS(s.message(), "=3");
}

TEST_F(Flags, FlagNamesMatchExactly) {
  Status s = ParseArgs(parser_, {"--por", "1"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "unknown flag --por");
}

TEST_F(Flags, MissingValueIsNamed) {
  Status s = ParseArgs(parser_, {"--verbose", "--port"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--port: missing value");
}

TEST_F(Flags, BadIntegerNamesFlagAndValue) {
  Status s = ParseArgs(parser_, {"--port", "12x"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--port: expected an integer, got '12x'");
}

TEST_F(Flags, EmptyIntegerRejected) {
  Status s = ParseArgs(parser_, {"--port="});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--port: expected an integer, got ''");
}

TEST_F(Flags, IntegerOutOfRangeRejected) {
  Status s = ParseArgs(parser_, {"--port", "2147483648"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "'2147483648'");
  EXPECT_EQ(opts_.port, 8080);
}

TEST_F(Flags, NegativeUnsignedRejected) {
  Status s = ParseArgs(parser_, {"--budget=-1"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--budget: expected an integer, got '-1'");
}

TEST_F(Flags, FractionalIntegerRejected) {
  Status s = ParseArgs(parser_, {"--seed", "1.5"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--seed: expected an integer, got '1.5'");
}

TEST_F(Flags, BadNumberNamesFlagAndValue) {
  Status s = ParseArgs(parser_, {"--lr", "fast"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--lr: expected a number, got 'fast'");

  s = ParseArgs(parser_, {"--momentum=0.9x"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--momentum: expected a number, got '0.9x'");
}

TEST_F(Flags, BoolWithoutValue) {
  ASSERT_TRUE(ParseArgs(parser_, {"--verbose"}).ok());
  EXPECT_TRUE(opts_.verbose);
}

TEST_F(Flags, BoolAcceptsExplicitValues) {
  ASSERT_TRUE(ParseArgs(parser_, {"--verbose=true"}).ok());
  EXPECT_TRUE(opts_.verbose);
  ASSERT_TRUE(ParseArgs(parser_, {"--verbose=false"}).ok());
  EXPECT_FALSE(opts_.verbose);
  ASSERT_TRUE(ParseArgs(parser_, {"--verbose=1"}).ok());
  EXPECT_TRUE(opts_.verbose);
  ASSERT_TRUE(ParseArgs(parser_, {"--verbose=0"}).ok());
  EXPECT_FALSE(opts_.verbose);
}

TEST_F(Flags, BadBoolNamesFlagAndValue) {
  Status s = ParseArgs(parser_, {"--verbose=maybe"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--verbose: expected true or false, got 'maybe'");
}

TEST_F(Flags, BoolDoesNotConsumeNextArgument) {
  ASSERT_TRUE(ParseArgs(parser_, {"--verbose", "false"}).ok());
  EXPECT_TRUE(opts_.verbose);
  EXPECT_EQ(parser_.positional(), std::vector<std::string>{"false"});
}

TEST_F(Flags, HelpRequested) {
  Status s = ParseArgs(parser_, {"--port", "1", "--help"});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(parser_.help_requested());
  EXPECT_FALSE(parser_.WasSet("help"));
}

TEST(NumberText, ReadsBackAsTheSameDouble) {
  EXPECT_EQ(NumberText(1e-7), "1e-07");
  EXPECT_EQ(NumberText(0.001), "0.001");
  EXPECT_EQ(NumberText(3.0), "3");
  EXPECT_EQ(NumberText(0.0005), "0.0005");  // not to_chars' "5e-04"
  EXPECT_EQ(NumberText(2e20), "2e+20");
  for (double v : {1e-7, 0.001, 2.5, 1.0 / 3.0, 123456789.125, -4e-300}) {
    EXPECT_EQ(std::strtod(NumberText(v).c_str(), nullptr), v) << v;
  }
}

TEST(NumberText, AFloatReadsBackAsTheSameFloatInItsShortestText) {
  EXPECT_EQ(NumberText(0.001f), "0.001");
  EXPECT_EQ(NumberText(1e-8f), "1e-08");
  EXPECT_EQ(NumberText(0.0005f), "0.0005");
  for (float v : {1e-7f, 0.001f, 0.999f, 1.0f / 3.0f, 3e38f}) {
    EXPECT_EQ(std::strtof(NumberText(v).c_str(), nullptr), v) << v;
  }
}

TEST(ParseWidths, ReadsCommaSeparatedWidthsAndNamesTheFlagWhenBad) {
  auto widths = ParseWidths("512,256,10", "--hidden");
  ASSERT_TRUE(widths.ok()) << widths.status().ToString();
  EXPECT_EQ(*widths, (std::vector<int>{512, 256, 10}));
  auto none = ParseWidths("", "--hidden");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  for (const char* bad :
       {"0", "128,", ",64", "12x", "-3", "+5", " 5", "2000000", "a"}) {
    auto r = ParseWidths(bad, "--hidden");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message(),
              std::string("--hidden: expected widths like 256,128, got '") +
                  bad + "'");
  }
}

TEST(FlagsShortHelp, DashHIsHelpNotAPositional) {
  int port = 0;
  FlagParser parser("prog", "Runs a test program.");
  parser.AddInt("port", &port, "port");
  Status s = ParseArgs(parser, {"-h"});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(parser.help_requested());
  EXPECT_TRUE(parser.positional().empty());
  EXPECT_CONTAINS(parser.Usage(), "  -h, --help\n");
}

TEST_F(Flags, PositionalCollected) {
  Status s = ParseArgs(
      parser_, {"first", "--port", "1", "second", "-x", "--verbose", "third"});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(parser_.positional(),
            (std::vector<std::string>{"first", "second", "-x", "third"}));
  EXPECT_EQ(opts_.port, 1);
  EXPECT_TRUE(opts_.verbose);
}

TEST_F(Flags, UsageListsDefaults) {
  std::string usage = parser_.Usage();
  EXPECT_CONTAINS(usage, "usage: prog [flags]\nRuns a test program.\n");
  EXPECT_CONTAINS(usage,
                  "  --name VALUE\n      the name (default: "
                  "default-name)\n");
  EXPECT_CONTAINS(usage,
                  "  --port VALUE\n      port to listen on "
                  "(default: 8080)\n");
  EXPECT_CONTAINS(usage, "(default: -7)");
  EXPECT_CONTAINS(usage, "(default: 100)");
  EXPECT_CONTAINS(usage, "learning rate (default: 0.5)");
  EXPECT_CONTAINS(usage, "momentum (default: 0.25)");
  // Booleans take no VALUE.
  EXPECT_CONTAINS(usage, "  --verbose\n      log more (default: false)\n");
  EXPECT_CONTAINS(usage, "  -h, --help\n");
}

TEST_F(Flags, UsageShowsDefaultsBeforeParsing) {
  ASSERT_TRUE(ParseArgs(parser_, {"--port", "1"}).ok());
  EXPECT_CONTAINS(parser_.Usage(), "(default: 8080)");
}

TEST(FlagsUsage, EmptyStringDefaultNotShown) {
  std::string address;
  FlagParser parser("prog", "summary");
  parser.AddString("address", &address, "where to connect");
  EXPECT_CONTAINS(parser.Usage(),
                  "  --address VALUE\n      where to connect\n");
  EXPECT_NOT_CONTAINS(parser.Usage(), "(default:");
}

TEST(HostPort, ParsesNameAndPort) {
  auto hp = ParseHostPort("localhost:8080", "--listen");
  ASSERT_TRUE(hp.ok()) << hp.status().ToString();
  EXPECT_EQ(hp->host, "localhost");
  EXPECT_EQ(hp->port, 8080);
  EXPECT_EQ(hp->ToString(), "localhost:8080");
}

TEST(HostPort, ParsesIpv4) {
  auto hp = ParseHostPort("10.0.0.7:65535", "--listen");
  ASSERT_TRUE(hp.ok()) << hp.status().ToString();
  EXPECT_EQ(hp->host, "10.0.0.7");
  EXPECT_EQ(hp->port, 65535);
}

TEST(HostPort, ParsesBracketedIpv6) {
  auto hp = ParseHostPort("[::1]:9000", "--listen");
  ASSERT_TRUE(hp.ok()) << hp.status().ToString();
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 9000);
  EXPECT_EQ(hp->ToString(), "[::1]:9000");
}

TEST(HostPort, ToStringRoundTrips) {
  for (const char* text : {"example.org:1", "[fe80::1]:443", "0.0.0.0:7000"}) {
    auto hp = ParseHostPort(text, "peer");
    ASSERT_TRUE(hp.ok()) << text << ": " << hp.status().ToString();
    EXPECT_EQ(hp->ToString(), text);
  }
}

TEST(HostPort, MissingPortRejected) {
  auto hp = ParseHostPort("localhost", "--coordinator");
  EXPECT_EQ(hp.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(hp.status().message(),
            "--coordinator: expected HOST:PORT, got 'localhost'");
}

TEST(HostPort, EmptyPortRejected) {
  auto hp = ParseHostPort("localhost:", "--coordinator");
  EXPECT_EQ(hp.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(hp.status().message(),
            "--coordinator: expected HOST:PORT, got 'localhost:'");
}

TEST(HostPort, MissingHostRejected) {
  auto hp = ParseHostPort(":80", "--coordinator");
  EXPECT_EQ(hp.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(hp.status().message(),
            "--coordinator: expected HOST:PORT, got ':80'");
}

TEST(HostPort, BadPortNamesWhatAndText) {
  auto hp = ParseHostPort("host:80x", "shard 2");
  EXPECT_EQ(hp.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(hp.status().message(), "shard 2: bad port '80x' in 'host:80x'");
}

TEST(HostPort, OutOfRangePortRejected) {
  for (const char* text : {"host:65536", "host:-1", "host:99999999999"}) {
    auto hp = ParseHostPort(text, "--listen");
    EXPECT_EQ(hp.status().code(), Code::kInvalidArgument) << text;
    EXPECT_CONTAINS(hp.status().message(), "bad port") << text;
  }
}

TEST(HostPort, SignedPortRejected) {
  auto hp = ParseHostPort("host:+80", "--listen");
  EXPECT_EQ(hp.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(hp.status().message(), "--listen: bad port '+80' in 'host:+80'");
}

TEST(HostPort, ZeroPortRejectedByDefault) {
  auto hp = ParseHostPort("host:0", "--coordinator");
  EXPECT_EQ(hp.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(hp.status().message(), "--coordinator: bad port '0' in 'host:0'");
}

TEST(HostPort, ZeroPortAllowedWhenAsked) {
  auto hp = ParseHostPort("0.0.0.0:0", "--listen", /*allow_zero_port=*/true);
  ASSERT_TRUE(hp.ok()) << hp.status().ToString();
  EXPECT_EQ(hp->host, "0.0.0.0");
  EXPECT_EQ(hp->port, 0);
}

TEST_F(Flags, DoubleDashEndsFlags) {
  ASSERT_TRUE(ParseArgs(parser_, {"--port", "1", "--", "--name", "x"}).ok());
  EXPECT_EQ(opts_.port, 1);
  EXPECT_EQ(opts_.name, "default-name");
  EXPECT_EQ(parser_.positional(), (std::vector<std::string>{"--name", "x"}));
}

TEST_F(Flags, FlagWhereValueBelongsIsMissingValue) {
  Status s = ParseArgs(parser_, {"--name", "--port", "3"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "--name: missing value");
}

TEST_F(Flags, FloatOutOfRangeRejected) {
  Status s = ParseArgs(parser_, {"--momentum", "1e300"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "--momentum");
  EXPECT_FALSE(ParseArgs(parser_, {"--lr", "inf"}).ok());
  EXPECT_FALSE(ParseArgs(parser_, {"--lr", "nan"}).ok());
  EXPECT_TRUE(ParseArgs(parser_, {"--lr", "1e-310"}).ok());
}

TEST(HostPort, MalformedHostsRejected) {
  for (const char* text : {"[]:80", "[::1]x:80", "a:b:80", "[::1:80"}) {
    auto hp = ParseHostPort(text, "--listen");
    EXPECT_FALSE(hp.ok()) << text;
    if (!hp.ok()) {
      EXPECT_CONTAINS(hp.status().message(), "--listen");
    }
  }
}

TEST(HostPort, BracketedIpv6WithoutPortRejected) {
  auto hp = ParseHostPort("[::1]", "--listen");
  EXPECT_EQ(hp.status().code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(hp.status().message(), "'[::1]'");
}

}  // namespace
}  // namespace tether

namespace tether {
namespace {

TEST(FlagsForMain, ExitCodesForHelpErrorsAndStrayArguments) {
  int port = 0;
  auto parse = [&](std::vector<const char*> argv, bool positional) {
    FlagParser p("prog", "test");
    p.AddInt("port", &port, "port");
    argv.insert(argv.begin(), "prog");
    return p.ParseForMain(static_cast<int>(argv.size()), argv.data(),
                          positional);
  };
  EXPECT_EQ(parse({"--help"}, false), std::optional<int>(0));
  EXPECT_EQ(parse({"--bogus"}, false), std::optional<int>(2));
  EXPECT_EQ(parse({"stray"}, false), std::optional<int>(2));
  EXPECT_EQ(parse({"stray"}, true), std::nullopt);
  EXPECT_EQ(parse({"--port", "9"}, false), std::nullopt);
  EXPECT_EQ(port, 9);
}

// Environment variables stand for flags (Kubernetes' env, Slurm's
// exports): TETHERTEST_<FLAG>, a flag on the command line winning over its
// variable, an empty boolean variable meaning true, and a bad value named
// by its variable and its flag.
class FlagsFromEnvironment : public Flags {
 protected:
  FlagsFromEnvironment() { parser_.UseEnvironment("TETHERTEST_"); }
  ~FlagsFromEnvironment() override {
    for (const char* v : {"TETHERTEST_PORT", "TETHERTEST_NAME",
                          "TETHERTEST_VERBOSE", "TETHERTEST_LR"}) {
      unsetenv(v);
    }
  }
};

TEST_F(FlagsFromEnvironment, VariableSetsTheFlagAndCountsAsGiven) {
  setenv("TETHERTEST_PORT", "7071", 1);
  setenv("TETHERTEST_VERBOSE", "", 1);
  ASSERT_TRUE(ParseArgs(parser_, {}).ok());
  EXPECT_EQ(opts_.port, 7071);
  EXPECT_TRUE(opts_.verbose);
  EXPECT_TRUE(parser_.WasSet("port"));
  EXPECT_EQ(parser_.from_environment(),
            (std::vector<std::string>{"port", "verbose"}));
  EXPECT_EQ(parser_.EnvironmentName("auth-key-file"),
            "TETHERTEST_AUTH_KEY_FILE");
}

TEST_F(FlagsFromEnvironment, CommandLineWinsOverTheVariable) {
  setenv("TETHERTEST_NAME", "from-env", 1);
  ASSERT_TRUE(ParseArgs(parser_, {"--name", "from-argv"}).ok());
  EXPECT_EQ(opts_.name, "from-argv");
  EXPECT_TRUE(parser_.from_environment().empty());
}

TEST_F(FlagsFromEnvironment, BadValueNamesTheVariableAndTheFlag) {
  setenv("TETHERTEST_LR", "fast", 1);
  Status s = ParseArgs(parser_, {});
  ASSERT_FALSE(s.ok());
  EXPECT_CONTAINS(s.message(), "TETHERTEST_LR");
  EXPECT_CONTAINS(s.message(), "--lr");
}

TEST_F(Flags, VariablesAreIgnoredUnlessAsked) {
  setenv("PORT", "1", 1);
  setenv("TETHER_PORT", "2", 1);
  ASSERT_TRUE(ParseArgs(parser_, {}).ok());
  unsetenv("PORT");
  unsetenv("TETHER_PORT");
  EXPECT_EQ(opts_.port, 8080);
  EXPECT_EQ(parser_.EnvironmentName("port"), "");
}

TEST_F(FlagsFromEnvironment, UsageSaysHowVariablesAreNamed) {
  EXPECT_CONTAINS(parser_.Usage(), "TETHERTEST_AUTH_KEY_FILE");
}

}  // namespace
}  // namespace tether
