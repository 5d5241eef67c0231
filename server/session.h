// One accepted TCP connection on a shard: it waits for Hello, checks the
// protocol version, admits the peer through the coordinator (shard 0) or
// directly (other shards), then hands every message to the Shard.
//
// Lives as long as its Connection has work (shared_ptr captured by the
// connection's handlers); Close() may be called from any thread.
#pragma once

#include <memory>

#include "schema/auth.h"
#include "schema/connection.h"
#include "server/coordinator.h"
#include "server/direct_read.h"
#include "server/monitor.h"
#include "server/shard.h"

namespace tether {

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `shard` must outlive the session; `coordinator` and `monitor` (which
  // takes the figures other shards send) are null except on shard 0. With
  // `key`, the peer must prove it holds the key (schema/auth.h). With
  // `direct_memory`, a worker on this host that offers its process id has
  // its pushes read from its memory (server/direct_read.h).
  Session(Stream stream, const ConnectionOptions& options,
          std::shared_ptr<const AuthKey> key, Shard* shard,
          Coordinator* coordinator, Monitor* monitor,
          bool direct_memory = true);

  void Start();
  void Close();

  // Handles one verified frame from the peer. The connection calls it on
  // its strand; the message-handler fuzzer calls it directly, on a session
  // that was never started.
  void Deliver(Frame frame);

 private:
  // A message after the Hello, in its turn when a replay orders it.
  void Dispatch(const wire::Message& message);
  // A data request a replay does not order (Shard::InOrder's `unordered`).
  void Unordered(const wire::Message& message);
  void OnHello(const wire::Hello& hello);
  // A worker's Hello offered its process id: taken when that process
  // holds the other end of this connection.
  void TakeDirectOffer(int pid);
  void OnDataRequest(const wire::DataRequest& request);
  void OnShareRequest(const wire::ShareRequest& request);
  void OnClosed(const Status& why);
  void Refuse(const Status& why);
  OutFrame MakeWelcome(int rank, int staleness) const;

  // Constant after construction.
  // The connection's ends over plain TCP; nullopt over TLS or once the
  // socket could not say (direct reads are then never offered).
  const std::optional<SocketEnds> ends_;
  const bool direct_memory_;
  Shard* const shard_;
  Coordinator* const coordinator_;
  Monitor* const monitor_;
  const std::shared_ptr<Connection> conn_;

  // Touched on the connection's strand only.
  bool hello_done_ = false;
  ShardAuth auth_;
  PeerInfo peer_;
};

}  // namespace tether
