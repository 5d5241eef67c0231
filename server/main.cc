// tether-server: one shard of a tether parameter server. See --help.
#include <cstdio>
#include <iostream>

#include "schema/launcher.h"
#include "schema/log.h"
#include "server/options.h"
#include "server/server.h"

int main(int argc, char** argv) {
  tether::DieWithLauncher();  // started by tether-up or a test
  bool help = false;
  auto options = tether::ParseServerOptions(argc, argv, &help);
  if (help) {
    std::cout << tether::ServerUsage();
    return 0;
  }
  if (!options.ok()) {
    std::cerr << "tether-server: " << options.status().message() << "\n";
    return 2;
  }
  if (options->check) {
    std::cout << "tether-server: flags ok: "
              << tether::DescribeServerOptions(*options) << "\n";
    return 0;
  }
  options->argv.assign(argv, argv + argc);
  tether::InitLogging(
      "shard " + std::to_string(options->shard_id),
      options->verbose ? tether::LogLevel::kDebug : tether::LogLevel::kInfo);
  tether::Server server(*options);
  if (tether::Status s = server.Start(); !s.ok()) {
    std::cerr << "tether-server: " << s.message() << "\n";
    server.Stop();
    return 1;
  }
  if (tether::Status s = server.Run(); !s.ok()) {
    std::cerr << "tether-server: " << s.message() << "\n";
    return 1;
  }
  TETHER_LOG(kInfo) << "stopped";
  return 0;
}
