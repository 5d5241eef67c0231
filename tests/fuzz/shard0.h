// For the fuzzers: a fresh shard 0 (shard, coordinator and dashboard), set
// up as tether-server sets it up but without sockets, so each input starts
// from the same state. Two workers, blocks of 16 floats, small limits.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>

#include "server/coordinator.h"
#include "server/dashboard.h"
#include "server/options.h"
#include "server/run_settings.h"
#include "server/shard.h"

namespace tether::fuzz {

struct Shard0 {
  Shard0() {
    options.run.num_workers = 2;
    options.run.block_size = 16;
    options.max_keys = 1024;
    options.max_waiting = 16;
    settings = options.run;
    shard = std::make_unique<Shard>(0, settings, size_t{1} << 20);
    shard->SetLimits(options.max_keys, options.max_waiting);
    coordinator = MakeCoordinator(*shard, "127.0.0.1:7070");
    dashboard = Dashboard::Create(io, options.dashboard, shard.get(),
                                  coordinator.get());
  }
  ~Shard0() {
    dashboard.reset();
    io.restart();
    io.poll();  // queued writes fail on the unopened sockets and close
    coordinator.reset();
    shard.reset();
  }

  // Declared first: destroyed last, after everything holding its sockets.
  boost::asio::io_context io;
  ServerOptions options;
  RunSettings settings;
  std::unique_ptr<Shard> shard;
  std::unique_ptr<Coordinator> coordinator;
  std::shared_ptr<Dashboard> dashboard;
};

}  // namespace tether::fuzz
