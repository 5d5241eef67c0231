#include "server/direct_read.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace tether {
namespace {

// `endpoint` as /proc/net/tcp writes it ("0100007F:1F90": the address's
// 32-bit words and the port in hex, as the kernel holds them), with the
// file that lists it: an IPv4 (or IPv4-mapped) address in tcp, others in
// tcp6.
struct ProcForm {
  std::string file;
  std::string text;
};

ProcForm ProcFormOf(const boost::asio::ip::tcp::endpoint& endpoint) {
  auto address = endpoint.address();
  char port[8];
  std::snprintf(port, sizeof(port), "%04X", endpoint.port());
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    address = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped,
                                               address.to_v6());
  }
  std::string text;
  char word[12];
  if (address.is_v4()) {
    auto bytes = address.to_v4().to_bytes();
    uint32_t raw;
    std::memcpy(&raw, bytes.data(), 4);
    std::snprintf(word, sizeof(word), "%08X", raw);
    return {"/proc/net/tcp", std::string(word) + ":" + port};
  }
  auto bytes = address.to_v6().to_bytes();
  for (size_t i = 0; i < 16; i += 4) {
    uint32_t raw;
    std::memcpy(&raw, bytes.data() + i, 4);
    std::snprintf(word, sizeof(word), "%08X", raw);
    text += word;
  }
  return {"/proc/net/tcp6", text + ":" + port};
}

// The inode of the socket `file` lists from `from` to `to`; 0 if none.
uint64_t SocketInode(const std::string& file, const std::string& from,
                     const std::string& to) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits;
    uint64_t uid = 0, timeout = 0, inode = 0;
    fields >> slot >> local >> remote >> state >> queues >> timer >>
        retransmits >> uid >> timeout >> inode;
    if (fields && local == from && remote == to) return inode;
  }
  return 0;
}

// "0x..." for an address in another process.
std::string AddressText(uint64_t address) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%" PRIx64, address);
  return text;
}

}  // namespace

Status CheckPeerProcess(int pid, const SocketEnds& ends) {
  if (pid <= 0) return Unavailable("no process id offered");
  const ProcForm peer = ProcFormOf(ends.remote);
  const ProcForm us = ProcFormOf(ends.local);
  if (peer.file != us.file) {
    return Unavailable(
        "the two ends of the connection are of different "
        "address families");
  }
  const uint64_t inode = SocketInode(peer.file, peer.text, us.text);
  if (inode == 0) {
    return Unavailable(
        "the peer's end of the connection is not a socket of "
        "this host (or of this network namespace)");
  }
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code link_ec;
    auto target = std::filesystem::read_symlink(it->path(), link_ec);
    if (!link_ec && target.string() == want) return Status::Ok();
  }
  if (ec) {
    return Unavailable("cannot list " + dir + ": " + ec.message());
  }
  return Unavailable("process " + std::to_string(pid) +
                     " does not hold the peer's end of the connection");
}

bool IsDirectPush(const wire::Push& push) {
  if (push.blocks() == nullptr) return false;
  for (const wire::Block* block : *push.blocks()) {
    if (block->address() != 0) return true;
  }
  return false;
}

Result<Frame> ReadDirectPush(int pid, const wire::Push& push,
                             size_t max_frame_bytes) {
  const auto& blocks = *push.blocks();
  uint64_t floats = 0;
  for (const wire::Block* block : blocks) {
    if (block->address() == 0 || block->values() != nullptr ||
        block->bf16() != nullptr || block->q8() != nullptr) {
      return InvalidArgument(
          "push names the floats of some blocks by "
          "address but not of block " +
          std::to_string(block->index()));
    }
    floats += block->count();
  }
  const uint64_t bytes =
      floats * sizeof(float) + uint64_t{blocks.size()} * 32 + 1024;
  if (bytes > max_frame_bytes) {
    return InvalidArgument("push names " + std::to_string(floats) +
                           " floats by address: past the frame limit of " +
                           std::to_string(max_frame_bytes) + " bytes");
  }
  auto fbb = MakeBuilder(bytes);
  std::vector<flatbuffers::Offset<wire::Block>> out;
  out.reserve(blocks.size());
  for (const wire::Block* block : blocks) {
    float* into = nullptr;
    auto values = fbb.CreateUninitializedVector(block->count(), &into);
    const size_t want = size_t{block->count()} * sizeof(float);
    iovec local{into, want};
    // An address in the worker's process, not ours: never dereferenced here.
    iovec remote{reinterpret_cast<void*>(  // NOLINT(performance-no-int-to-ptr)
                     block->address()),
                 want};
    ssize_t got =
        want == 0 ? 0 : process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got != static_cast<ssize_t>(want)) {
      const int err = errno;
      std::string what = "push to block " + std::to_string(block->index());
      what += ": cannot read its " + std::to_string(block->count());
      what += " floats at " + AddressText(block->address());
      what += " in worker process " + std::to_string(pid) + ": ";
      what += got < 0 ? std::strerror(err)
                      : "read " + std::to_string(got) + " of " +
                            std::to_string(want) + " bytes";
      if (got < 0 && err == EFAULT) return InvalidArgument(what);
      return ProtocolError(what);
    }
    out.push_back(wire::CreateBlock(fbb, block->index(), values));
  }
  auto blocks_offset = fbb.CreateVector(out);
  wire::PushBuilder pb(fbb);
  pb.add_request_id(push.request_id());
  pb.add_tensor(push.tensor());
  pb.add_read_clock(push.read_clock());
  pb.add_blocks(blocks_offset);
  pb.add_provide(push.provide());
  pb.add_assign(push.assign());
  wire::FinishSizePrefixedMessageBuffer(
      fbb, wire::CreateMessage(fbb, wire::Body::Push, pb.Finish().Union()));
  // The builder's buffer becomes the frame: the floats are not copied again.
  Frame frame = Frame::Adopt(fbb);
  TETHER_RETURN_IF_ERROR(frame.Verify());
  return frame;
}

OutFrame WriteLanding(const Landing& landing, OutFrame reply) {
  std::vector<iovec> local;
  local.reserve(landing.pieces.size());
  size_t total = 0;
  for (const Landing::Piece& piece : landing.pieces) {
    if (piece.values.empty()) continue;
    local.push_back(
        {const_cast<float*>(piece.values.data()), piece.values.size_bytes()});
    total += piece.values.size_bytes();
  }
  size_t written = 0;
  // At most IOV_MAX (1024) pieces a call.
  for (size_t first = 0; first < local.size(); first += 1024) {
    const size_t count = std::min<size_t>(1024, local.size() - first);
    size_t bytes = 0;
    for (size_t i = first; i < first + count; ++i) bytes += local[i].iov_len;
    iovec remote{reinterpret_cast<void*>(  // NOLINT(performance-no-int-to-ptr)
                     landing.address + written),
                 bytes};
    ssize_t got = process_vm_writev(landing.pid, local.data() + first, count,
                                    &remote, 1, 0);
    if (got != static_cast<ssize_t>(bytes)) {
      const int err = errno;
      std::string what =
          "pull: cannot write its " + std::to_string(total / sizeof(float));
      what += " floats at " + AddressText(landing.address);
      what += " in worker process " + std::to_string(landing.pid) + ": ";
      what += got < 0 ? std::strerror(err)
                      : "wrote " + std::to_string(written + got) + " of " +
                            std::to_string(total) + " bytes";
      return MakeErrorFrame(landing.request_id, got < 0 && err == EFAULT
                                                    ? InvalidArgument(what)
                                                    : ProtocolError(what));
    }
    written += bytes;
  }
  return reply;
}

}  // namespace tether
