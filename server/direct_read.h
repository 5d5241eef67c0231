// Pushes read straight from a worker's memory, and pulls written straight
// into it, when the worker runs on the shard's host (Hello.direct_pid): the
// push frame names where each block's floats lie in the worker's process
// and the shard copies them with one process_vm_readv; a pull names where
// its values go (Pull.landing) and the shard writes them there with
// process_vm_writev before it answers. Neither goes through the kernel's
// TCP path. The worker's offer is taken only once the shard has checked
// that the process it names holds the other end of the connection, so a
// peer cannot point the shard at another process's memory.
//
// The floats are read when the shard takes the push, so the worker keeps
// them unchanged until the push is answered (Client's contract). One case
// escapes that: a worker that drops a connection to a shard gone silent
// (--worker-timeout-ms) fails the pushes in flight and repeats its step,
// while the stalled shard may still take a push it had received and read
// a buffer the repeated step is rewriting; over TCP it would apply the
// first step's floats instead. Either way that push is one the worker no
// longer counts.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "schema/frame.h"
#include "schema/status.h"

namespace tether {

// The two ends of a plain TCP connection, as this (the shard's) end sees
// them.
struct SocketEnds {
  boost::asio::ip::tcp::endpoint local;
  boost::asio::ip::tcp::endpoint remote;
};

// OK when process `pid` holds the socket at the other end of `ends`: the
// socket /proc/net/tcp (or tcp6) lists from `remote` to `local` is one of
// the process's open files. kUnavailable saying why not (another host or
// network namespace, no such process, its files not readable by us).
Status CheckPeerProcess(int pid, const SocketEnds& ends);

// Whether `push` names its floats by address (Block.address) rather than
// carrying them.
bool IsDirectPush(const wire::Push& push);

// `push` as the frame it stands for: the same request with each block's
// `count` floats read from process `pid` at its `address`. kInvalidArgument
// for a block without an address, or counts whose floats would pass
// `max_frame_bytes`, or an address the process has not mapped; kProtocol
// when the memory cannot be read for another reason (the process gone, or
// no longer ours to read): the worker then sends its floats instead. Both
// name the block, the address and the reason.
Result<Frame> ReadDirectPush(int pid, const wire::Push& push,
                             size_t max_frame_bytes);

// Where the values of a pull's reply go in a same-host worker's memory
// (Pull.landing), and what they are.
struct Landing {
  int pid = 0;
  uint64_t request_id = 0;
  uint64_t address = 0;
  struct Piece {
    std::shared_ptr<const void> owner;  // keeps `values` alive and unchanged
    std::span<const float> values;
  };
  // Written one after another from `address` on.
  std::vector<Piece> pieces;
};

// Writes `landing`'s values into its process and returns `reply`; or,
// when they cannot all be written, an Error answering the request instead:
// kInvalidArgument naming the address for one the process has not mapped,
// kProtocol for another reason (the worker then pulls again without a
// landing). Call with no lock held: it copies every value.
OutFrame WriteLanding(const Landing& landing, OutFrame reply);

}  // namespace tether
