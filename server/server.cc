#include "server/server.h"

#include <boost/asio/post.hpp>
#include <chrono>
#include <future>

#include "schema/log.h"

namespace tether {

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      work_(asio::make_work_guard(io_)),
      acceptor_(asio::make_strand(io_)),
      signals_(io_, SIGINT, SIGTERM) {
  connection_options_.max_frame_bytes = options_.max_frame_bytes;
}

Server::~Server() {
  try {
    Stop();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  } catch (const std::exception& e) {
    TETHER_LOG(kError) << "shutdown failed: " << e.what();
  }
}

Status Server::Bind() {
  auto listen = ParseHostPort(options_.listen, "--listen", true);
  if (!listen.ok()) return listen.status();
  boost::system::error_code ec;
  auto address = asio::ip::make_address(listen->host, ec);
  if (ec) {
    tcp::resolver resolver(io_);
    auto results =
        resolver.resolve(listen->host, std::to_string(listen->port), ec);
    if (ec || results.empty()) {
      return InvalidArgument("--listen: cannot resolve '" + listen->host + "'");
    }
    address = results.begin()->endpoint().address();
  }
  tcp::endpoint endpoint(address, listen->port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("--listen: cannot listen on " + options_.listen + ": " +
                       ec.message());
  }
  uint16_t port = acceptor_.local_endpoint().port();
  if (!options_.advertise.empty()) {
    address_ = options_.advertise;
  } else {
    address_ = HostPort{listen->host, port}.ToString();
  }
  return Status::Ok();
}

Status Server::Start() {
  TETHER_RETURN_IF_ERROR(Bind());
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back([this] { io_.run(); });
  }
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    TETHER_LOG(kInfo) << "signal " << sig << ": shutting down";
    Stop();
  });
  if (options_.shard_id == 0) {
    RunSettings settings = SettingsFromOptions(options_);
    shard_ = std::make_unique<Shard>(0, settings, options_.max_frame_bytes);
    Shard* shard = shard_.get();
    coordinator_ = std::make_unique<Coordinator>(
        settings, address_,
        [shard](int rank) { return shard->WorkerClock(rank); });
  } else {
    TETHER_RETURN_IF_ERROR(RegisterWithCoordinator());
  }
  TETHER_LOG(kInfo) << "shard " << options_.shard_id << " of "
                    << shard_->settings().num_shards << " listening on "
                    << address_;
  DoAccept();
  return Status::Ok();
}

Status Server::RegisterWithCoordinator() {
  auto coordinator = ParseHostPort(options_.coordinator, "--coordinator");
  if (!coordinator.ok()) return coordinator.status();
  auto socket = ConnectWithRetry(io_, *coordinator, "the coordinator",
                                 options_.connect_timeout_ms);
  if (!socket.ok()) return socket.status().WithContext("--coordinator");
  coordinator_link_ =
      std::make_shared<Connection>(std::move(*socket), connection_options_);
  auto answer = std::make_shared<std::promise<Result<RunSettings>>>();
  auto answered = std::make_shared<std::atomic<bool>>(false);
  auto welcomed = std::make_shared<std::atomic<bool>>(false);
  const std::string peer = "coordinator " + options_.coordinator;
  coordinator_link_->Start(
      [answer, answered, welcomed, peer](Frame frame) {
        const wire::Message& m = *frame.message();
        if (answered->exchange(true)) return;
        if (auto* welcome = m.body_as_Welcome()) {
          welcomed->store(true);
          answer->set_value(ReadRunConfig(welcome->config()));
        } else if (auto* error = m.body_as_Error()) {
          answer->set_value(StatusFromError(*error, peer));
        } else {
          answer->set_value(ProtocolError(peer + " answered Hello with " +
                                          wire::EnumNameBody(m.body_type())));
        }
      },
      [answer, answered, welcomed, peer, this](const Status& why) {
        if (!answered->exchange(true)) {
          answer->set_value(
              Unavailable(peer + " closed the connection" +
                          (why.ok() ? "" : ": " + why.message())));
        } else if (*welcomed && !stopping_) {
          TETHER_LOG(kWarning) << "lost the " << peer;
        }
      });
  flatbuffers::FlatBufferBuilder fbb(256);
  auto address = fbb.CreateString(address_);
  auto name = fbb.CreateString("shard " + std::to_string(options_.shard_id));
  auto hello = wire::CreateHello(fbb, kProtocolVersion, wire::Role::Shard, -1,
                                 0, options_.shard_id, address, 0, name);
  coordinator_link_->Send(FinishFrame(fbb, hello));
  auto future = answer->get_future();
  if (future.wait_for(std::chrono::milliseconds(std::max(
          options_.connect_timeout_ms, 1000))) != std::future_status::ready) {
    return Status(Code::kTimeout, peer + " did not answer Hello");
  }
  Result<RunSettings> settings = future.get();
  if (!settings.ok()) return settings.status();
  if (settings->num_shards != options_.shards) {
    return InvalidArgument("--shards: this shard was started with " +
                           std::to_string(options_.shards) +
                           " but the coordinator runs " +
                           std::to_string(settings->num_shards));
  }
  shard_ = std::make_unique<Shard>(options_.shard_id, *settings,
                                   options_.max_frame_bytes);
  return Status::Ok();
}

void Server::DoAccept() {
  acceptor_.async_accept(
      asio::make_strand(io_),
      [this](const boost::system::error_code& ec, tcp::socket socket) {
        OnAccept(ec, std::move(socket));
      });
}

void Server::OnAccept(const boost::system::error_code& ec, tcp::socket socket) {
  if (stopping_) return;
  if (ec) {
    // A failed accept (out of descriptors, a peer that reset) costs that
    // one connection only.
    TETHER_LOG(kWarning) << "accept failed: " << ec.message();
  } else {
    auto session =
        std::make_shared<Session>(std::move(socket), connection_options_,
                                  shard_.get(), coordinator_.get());
    {
      std::lock_guard lock(sessions_mu_);
      std::erase_if(sessions_, [](auto& w) { return w.expired(); });
      sessions_.push_back(session);
    }
    session->Start();
  }
  DoAccept();
}

void Server::Run() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void Server::Stop() {
  if (stopping_.exchange(true)) return;
  asio::post(acceptor_.get_executor(), [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    signals_.cancel(ignored);
    if (coordinator_link_) coordinator_link_->Close();
    std::vector<std::shared_ptr<Session>> sessions;
    {
      std::lock_guard lock(sessions_mu_);
      for (auto& w : sessions_) {
        if (auto s = w.lock()) sessions.push_back(std::move(s));
      }
    }
    for (auto& s : sessions) s->Close();
    work_.reset();
  });
}

}  // namespace tether
