// One accepted TCP connection on a shard: it waits for Hello, checks the
// protocol version, admits the peer through the coordinator (shard 0) or
// directly (other shards), then hands every message to the Shard.
//
// Lives as long as its Connection has work (shared_ptr captured by the
// connection's handlers); Close() may be called from any thread.
#pragma once

#include <memory>

#include "schema/connection.h"
#include "server/coordinator.h"
#include "server/monitor.h"
#include "server/shard.h"

namespace tether {

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `shard` must outlive the session; `coordinator` and `monitor` (which
  // takes the figures other shards send) are null except on shard 0.
  Session(tcp::socket socket, const ConnectionOptions& options, Shard* shard,
          Coordinator* coordinator, Monitor* monitor);

  void Start();
  void Close();

 private:
  void OnFrame(Frame frame);
  void OnHello(const wire::Hello& hello);
  void OnDataRequest(const wire::DataRequest& request);
  void OnClosed(const Status& why);
  void Refuse(const Status& why);
  OutFrame MakeWelcome(int rank, int staleness) const;

  // Constant after construction.
  Shard* const shard_;
  Coordinator* const coordinator_;
  Monitor* const monitor_;
  const std::shared_ptr<Connection> conn_;

  // Touched on the connection's strand only.
  bool hello_done_ = false;
  PeerInfo peer_;
};

}  // namespace tether
