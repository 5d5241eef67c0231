// tether._tether: the Python binding of worker/client.h (the `tether`
// package wraps it; see worker/python/tether/__init__.py).
//
// Buffers: pull/push take any object exporting a writable (pull) or
// readable (push) C-contiguous float32 buffer -- a NumPy array, or a CPU
// torch tensor's .numpy() view -- whose bytes go straight to and from the
// wire; anything else raises ValueError naming the tensor, and nothing is
// sent.
//
// The GIL: every blocking call releases it and waits in slices of 100 ms,
// checking for signals in between, so Ctrl-C interrupts a pull the
// staleness bound holds: the client is then closed (its requests fail and
// release their buffers) and KeyboardInterrupt is raised.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "schema/build_info.h"
#include "schema/io_pool.h"
#include "schema/shuffle.h"
#include "schema/wire_values.h"
#include "worker/client.h"
#include "worker/dataset.h"
#include "worker/training_loop.h"

namespace py = pybind11;

namespace tether {
namespace {

// Nanoseconds Python threads spent in the client library without the GIL
// (sending, and blocked on the wire and the shards), for
// tether.wait_seconds(): what a step spent outside Python and the binding.
std::atomic<int64_t> g_wait_ns{0};

// Releases the GIL for the client library, and counts the time.
class InClient {
 public:
  InClient() : start_(std::chrono::steady_clock::now()) {}
  ~InClient() {
    g_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - start_)
                     .count();
  }

 private:
  py::gil_scoped_release release_;
  std::chrono::steady_clock::time_point start_;
};

// A non-OK Status crossing into Python; translated to the tether.errors
// subclass for its code.
struct StatusError {
  Status status;
};

[[noreturn]] void Raise(const Status& s) { throw StatusError{s}; }

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Value(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

// How one asynchronous request ended: set by the client's I/O thread, read
// by the Python thread. Holds nothing of Python's, so the I/O thread may
// drop the last reference.
struct Signal {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

// One asynchronous request as Python sees it: its Signal, and `keep`, the
// caller's buffer object, held until the request is over. Only Python-side
// owners (under the GIL) hold a Pending.
struct Pending {
  std::shared_ptr<Signal> signal = std::make_shared<Signal>();
  py::object keep;

  Client::Callback Callback() const {
    return [signal = signal](const Status& s) {
      std::lock_guard lock(signal->mu);
      signal->status = s;
      signal->done = true;
      signal->cv.notify_all();
    };
  }
  bool done() const {
    std::lock_guard lock(signal->mu);
    return signal->done;
  }
  Status status() const {
    std::lock_guard lock(signal->mu);
    return signal->status;
  }
  // Waits up to `ms` without the GIL; whether it is done.
  bool WaitFor(int ms) const {
    InClient in_client;
    SleepingWaiter sleeping;  // the client's I/O threads stay awake
    std::unique_lock lock(signal->mu);
    return signal->cv.wait_for(lock, std::chrono::milliseconds(ms),
                               [&] { return signal->done; });
  }
};

// A buffer checked to be C-contiguous float32 of exactly `floats` elements.
struct Floats {
  py::buffer_info info;
  float* data() const { return static_cast<float*>(info.ptr); }
  size_t size() const { return static_cast<size_t>(info.size); }
};

Floats CheckFloats(const py::object& obj, bool writable,
                   const std::string& what, const std::string& expected_shape,
                   uint64_t floats) {
  const std::string expected =
      "expected a C-contiguous float32 array of shape " + expected_shape +
      " (" + std::to_string(floats) + " floats)";
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::value_error(
        what + ": got " +
        std::string(py::str(obj.get_type().attr("__name__"))) + ", " +
        expected);
  }
  py::buffer buffer = py::reinterpret_borrow<py::buffer>(obj);
  py::buffer_info info;
  try {
    info = buffer.request(writable);
  } catch (const py::error_already_set&) {
    throw py::value_error(what + ": the buffer is not " +
                          (writable ? "writable" : "readable") + ", " +
                          expected);
  }
  if (info.itemsize != 4 ||
      (info.format != "f" && info.format != "<f" && info.format != "=f")) {
    throw py::value_error(what + ": dtype is '" + info.format + "' (" +
                          std::to_string(info.itemsize) + "-byte items), " +
                          expected);
  }
  ssize_t stride = 4;
  for (ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != stride) {
      std::string message = what;
      message += ": the array is not C-contiguous, ";
      message += expected;
      message += " (use numpy.ascontiguousarray or tensor.contiguous())";
      throw py::value_error(message);
    }
    stride *= info.shape[d];
  }
  if (static_cast<uint64_t>(info.size) != floats) {
    std::vector<uint64_t> got(info.shape.begin(), info.shape.end());
    throw py::value_error(what + ": shape " + ShapeText(got) + " holds " +
                          std::to_string(info.size) + " floats, " + expected);
  }
  return Floats{std::move(info)};
}

Init ParseInit(const std::string& kind, float scale) {
  if (kind == "zeros") return {InitKind::kZeros, 0};
  if (kind == "uniform") return {InitKind::kUniform, scale};
  if (kind == "normal") return {InitKind::kNormal, scale};
  if (kind == "constant") return {InitKind::kConstant, scale};
  if (kind == "provided") return {InitKind::kProvided, 0};
  throw py::value_error("init: unknown kind '" + kind +
                        "' (expected zeros, uniform, normal, constant or "
                        "provided)");
}

py::dict StatsDict(const ShardStats& s) {
  py::dict d;
  d["shard_id"] = s.shard_id;
  d["tensors"] = s.tensors;
  d["dense_blocks"] = s.dense_blocks;
  d["sparse_rows"] = s.sparse_rows;
  d["bytes"] = s.bytes;
  d["pushes"] = s.pushes;
  d["pulls"] = s.pulls;
  d["rejected_pushes"] = s.rejected_pushes;
  d["waiting_pulls"] = s.waiting_pulls;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["min_clock"] = s.min_clock;
  d["staleness_histogram"] = s.staleness_histogram;
  d["staleness_sum"] = s.staleness_sum;
  d["evictions"] = s.evictions;
  d["late_pushes"] = s.late_pushes;
  py::list workers;
  for (const ShardStats::Worker& w : s.workers) {
    py::dict wd;
    wd["rank"] = w.rank;
    wd["clock"] = w.clock;
    wd["staleness"] = w.staleness;
    wd["connected"] = w.connected;
    wd["live"] = w.live;
    wd["epoch"] = w.epoch;
    wd["samples"] = w.samples;
    wd["loss"] = w.loss;
    wd["samples_per_s"] = w.samples_per_s;
    wd["test_accuracy"] = w.test_accuracy;
    wd["test_loss"] = w.test_loss;
    wd["device"] = w.device;
    wd["host"] = w.host;
    wd["wait_fraction"] = w.wait_fraction;
    wd["done"] = w.done;
    wd["nonfinite_pushes"] = w.nonfinite_pushes;
    workers.append(wd);
  }
  d["workers"] = workers;
  d["reports"] = s.reports;
  py::list epochs;
  for (const ShardStats::DataEpoch& e : s.data_epochs) {
    py::dict ed;
    ed["epoch"] = e.epoch;
    ed["chunks_total"] = e.chunks_total;
    ed["chunks_done"] = e.chunks_done;
    ed["rows_done"] = e.rows_done;
    ed["duplicates"] = e.duplicates;
    epochs.append(ed);
  }
  d["data_epochs"] = epochs;
  d["chunks_reassigned"] = s.chunks_reassigned;
  return d;
}

// What `define_*` recorded, to check buffers before anything is sent.
struct Meta {
  bool sparse = false;
  std::vector<uint64_t> shape;  // tensors
  uint32_t dim = 0;             // tables
  uint64_t size = 0;            // tensors: floats; tables: dim
};

// What a dense request does with its buffer. kPrefetch: a pull of the
// values this worker computes with at its next clock (Client::PrefetchAsync).
enum class Dense { kPull, kPush, kProvide, kAssign, kPrefetch };

class PyClient;

// The Python-visible future of an asynchronous request.
class PyFuture {
 public:
  // `client`: the Python object of the PyClient that started the request,
  // closed when a wait for it is interrupted.
  PyFuture(std::shared_ptr<Pending> p, py::object client)
      : p_(std::move(p)), client_(std::move(client)) {}
  bool done() { return p_->done(); }
  // Waits (interruptibly) and returns the value, or raises the error.
  py::object result(std::optional<double> timeout);

 private:
  std::shared_ptr<Pending> p_;
  py::object client_;
};

class PyClient {
 public:
  explicit PyClient(ClientOptions options) {
    // Connect blocks until every worker has joined: on a thread, so Ctrl-C
    // is heard meanwhile.
    auto result =
        std::make_shared<std::promise<Result<std::unique_ptr<Client>>>>();
    auto future = result->get_future();
    std::thread([result, options = std::move(options)]() mutable {
      result->set_value(Client::Connect(std::move(options)));
    }).detach();
    while (true) {
      std::future_status ready;
      {
        InClient in_client;
        ready = future.wait_for(std::chrono::milliseconds(100));
      }
      if (ready == std::future_status::ready) break;
      // The connecting thread finishes on its own and drops what it made.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    auto connected = future.get();
    if (!connected.ok()) Raise(connected.status());
    client_ = std::move(*connected);
  }

  ~PyClient() {
    try {
      Close();
    } catch (...) {  // a destructor must not throw; closing is best effort
    }
  }

  void Close() {
    std::unique_ptr<Client> client = std::move(client_);
    if (client) {
      InClient in_client;
      client.reset();  // pending requests fail; their callbacks run
    }
    inflight_.clear();
  }

  Client& c() {
    if (!client_) {
      Raise(
          Unavailable("the client is closed (close() was called, or a "
                      "blocking call was interrupted)"));
    }
    return *client_;
  }

  void DefineTensor(const std::string& name, std::vector<uint64_t> shape,
                    const std::string& kind, float scale) {
    Init init = ParseInit(kind, scale);
    Blocking([&](Client& client, Client::Callback cb) {
      client.DefineTensorAsync(name, shape, init, std::move(cb));
    });
    uint64_t size = 1;
    for (uint64_t d : shape) size *= d;
    meta_[name] = {false, std::move(shape), 0, size};
  }

  void DefineTable(const std::string& name, uint32_t dim,
                   const std::string& kind, float scale) {
    Init init = ParseInit(kind, scale);
    Blocking([&](Client& client, Client::Callback cb) {
      client.DefineTableAsync(name, dim, init, std::move(cb));
    });
    meta_[name] = {true, {}, dim, dim};
  }

  // One tensor: ManyStart of one.
  std::shared_ptr<Pending> DenseStart(Dense op, const std::string& name,
                                      const py::object& buffer) {
    py::list buffers;
    buffers.append(buffer);
    return ManyStart(op, {name}, buffers, false);
  }

  // Rows: `keys` a 1-D uint64 (or int64) array; `rows` keys * dim floats.
  std::shared_ptr<Pending> RowsStart(const std::string& table,
                                     const py::object& keys_obj,
                                     const py::object& rows, int op) {
    const Meta& m = Lookup(table, true);
    const char* verb = op == 0   ? "pull_rows"
                       : op == 1 ? "push_rows"
                                 : "provide_rows";
    auto keys =
        py::array_t<uint64_t, py::array::c_style |
                                  py::array::forcecast>::ensure(keys_obj);
    if (!keys || keys.ndim() != 1) {
      throw py::value_error(std::string(verb) + " '" + table +
                            "': keys must be a 1-D array of integers");
    }
    const uint64_t n = static_cast<uint64_t>(keys.size());
    Floats f = CheckFloats(
        rows, op == 0, std::string(verb) + " '" + table + "'",
        "(" + std::to_string(n) + ", " + std::to_string(m.dim) + ")",
        n * m.dim);
    auto p = Track(rows);
    p->keep = py::make_tuple(rows, keys);  // the converted keys too
    std::span<const uint64_t> k(keys.data(), n);
    Client& client = c();
    {
      InClient in_client;
      if (op == 0) {
        client.PullRowsAsync(table, k, {f.data(), f.size()}, p->Callback());
      } else if (op == 1) {
        client.PushRowsAsync(table, k, {f.data(), f.size()}, p->Callback());
      } else {
        client.ProvideRowsAsync(table, k, {f.data(), f.size()}, p->Callback());
      }
    }
    return p;
  }

  // Pulls, pushes or provides several tensors in one call: every buffer is
  // checked before anything is sent, one GIL release starts them all, and
  // one Pending ends when all have (with the first error). `clock` (pushes)
  // sends the Clock right behind them; its error comes first.
  std::shared_ptr<Pending> ManyStart(Dense op,
                                     const std::vector<std::string>& names,
                                     const py::list& buffers, bool clock) {
    if (names.size() != buffers.size()) {
      throw py::value_error(
          "pull_many/push_many: " + std::to_string(names.size()) + " names, " +
          std::to_string(buffers.size()) + " buffers");
    }
    const char* verb = op == Dense::kPull       ? "pull"
                       : op == Dense::kPrefetch ? "prefetch"
                       : op == Dense::kPush     ? "push"
                       : op == Dense::kAssign   ? "assign"
                                                : "provide";
    std::vector<Floats> checked;
    checked.reserve(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      checked.push_back(
          CheckedDense(names[i], buffers[i],
                       op == Dense::kPull || op == Dense::kPrefetch, verb));
    }
    auto p = Track(buffers);
    // Counts down the parts; the clock's error wins, then the first.
    struct Group {
      std::mutex mu;
      size_t left;
      Status first, clock;
      Client::Callback done;
    };
    auto group = std::make_shared<Group>();
    group->left = names.size() + (clock ? 1 : 0);
    group->done = p->Callback();
    auto part = [group](bool is_clock) {
      return [group, is_clock](const Status& s) {
        std::unique_lock lock(group->mu);
        if (!s.ok()) {
          Status& slot = is_clock ? group->clock : group->first;
          if (slot.ok()) slot = s;
        }
        if (--group->left > 0) return;
        Status result = group->clock.ok() ? group->first : group->clock;
        lock.unlock();
        group->done(result);
      };
    };
    Client& client = c();
    InClient in_client;
    if (group->left == 0) group->done(Status::Ok());
    for (size_t i = 0; i < names.size(); ++i) {
      const Floats& f = checked[i];
      const std::span<float> floats(f.data(), f.size());
      switch (op) {
        case Dense::kPull:
          client.PullAsync(names[i], floats, part(false));
          break;
        case Dense::kPrefetch:
          client.PrefetchAsync(names[i], floats, part(false));
          break;
        case Dense::kPush:
          client.PushAsync(names[i], floats, part(false));
          break;
        case Dense::kProvide:
          client.ProvideTensorAsync(names[i], floats, part(false));
          break;
        case Dense::kAssign:
          client.AssignTensorAsync(names[i], floats, part(false));
          break;
      }
    }
    if (clock) client.ClockAsync(part(true));
    return p;
  }

  // A tensor's push with the prefetch of its next values into `out` right
  // behind each of its parts (Client::PushAndPrefetchAsync): the push's
  // and the prefetch's Pendings.
  std::pair<std::shared_ptr<Pending>, std::shared_ptr<Pending>>
  PushAndPrefetchStart(const std::string& name, const py::object& grad,
                       const py::object& out) {
    const Floats g = CheckedDense(name, grad, false, "push");
    const Floats o = CheckedDense(name, out, true, "prefetch");
    auto pushed = Track(grad);
    auto fetched = Track(out);
    Client& client = c();
    InClient in_client;
    client.PushAndPrefetchAsync(name, {g.data(), g.size()},
                                {o.data(), o.size()}, pushed->Callback(),
                                fetched->Callback());
    return {pushed, fetched};
  }

  std::shared_ptr<Pending> ClockStart() {
    auto p = Track(py::none());
    Client& client = c();
    InClient in_client;
    client.ClockAsync(p->Callback());
    return p;
  }

  // Waits for `p` (interruptibly); raises its error.
  void Wait(const std::shared_ptr<Pending>& p) {
    while (!p->WaitFor(100)) {
      if (PyErr_CheckSignals() != 0) {
        // The request may hold the caller's buffer: closing the client
        // ends it before Python can free that buffer.
        py::error_already_set interrupted;
        Close();
        throw interrupted;
      }
    }
    Check(p->status());
  }

  template <typename Start>
  void Blocking(Start start) {
    auto p = Track(py::none());
    {
      Client& client = c();
      InClient in_client;
      start(client, p->Callback());
    }
    Wait(p);
  }

  // Runs a blocking client call on this thread without the GIL. Not
  // interruptible; for calls that answer promptly (no bound applies).
  template <typename F>
  auto Released(F f) {
    Client& client = c();
    InClient in_client;
    return f(client);
  }

  // Keeps `buffer` alive while the request runs; drops finished requests'.
  std::shared_ptr<Pending> Track(const py::object& buffer) {
    std::erase_if(inflight_,
                  [](const std::shared_ptr<Pending>& p) { return p->done(); });
    auto p = std::make_shared<Pending>();
    p->keep = buffer;
    inflight_.push_back(p);
    return p;
  }

  // `buffer` checked to hold dense tensor `name`'s values, for `verb`
  // ("push", "pull", ...) as the error names it.
  Floats CheckedDense(const std::string& name, const py::object& buffer,
                      bool writable, const char* verb) {
    const Meta& m = Lookup(name, false);
    return CheckFloats(buffer, writable, std::string(verb) + " '" + name + "'",
                       ShapeText(m.shape), m.size);
  }

  const Meta& Lookup(const std::string& name, bool sparse) {
    auto it = meta_.find(name);
    if (it == meta_.end() || it->second.sparse != sparse) {
      throw py::value_error(std::string(sparse ? "table '" : "tensor '") +
                            name + "' is not defined by this client (call " +
                            (sparse ? "define_table" : "define_tensor") +
                            " first)");
    }
    return it->second;
  }

 private:
  std::unique_ptr<Client> client_;
  std::unordered_map<std::string, Meta> meta_;
  std::vector<std::shared_ptr<Pending>> inflight_;
};

py::object PyFuture::result(std::optional<double> timeout) {
  const auto start = std::chrono::steady_clock::now();
  while (!p_->WaitFor(100)) {
    if (PyErr_CheckSignals() != 0) {
      // As for a blocking call: the client is closed, so that the request
      // ends before Python can free the buffer it writes.
      py::error_already_set interrupted;
      client_.attr("close")();
      throw interrupted;
    }
    if (timeout &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                .count() >= *timeout) {
      throw StatusError{Status(Code::kTimeout, "the request is still running")};
    }
  }
  Check(p_->status());
  return py::none();
}

py::tuple DatasetArrays(DenseDataset&& d) {
  auto owner = std::make_unique<DenseDataset>(std::move(d));
  DenseDataset* raw = owner.get();
  py::capsule free(owner.release(),
                   [](void* p) { delete static_cast<DenseDataset*>(p); });
  py::array_t<float> x({static_cast<py::ssize_t>(raw->rows),
                        static_cast<py::ssize_t>(raw->features)},
                       raw->x.data(), free);
  py::array_t<int32_t> y(static_cast<py::ssize_t>(raw->rows), raw->y.data(),
                         free);
  return py::make_tuple(x, y, raw->classes);
}

}  // namespace
}  // namespace tether

PYBIND11_MODULE(_tether, m) {
  using namespace tether;
  m.doc() = "tether's client library (worker/client.h); use the tether package";
  m.def(
      "build_info",
      [] { return py::make_tuple(TetherVersion(), TetherCommit()); },
      "(version, commit) of the tether build this module comes from "
      "(schema/build_info.h).");

  // pybind11 takes a function pointer of this exact signature.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object make = py::module_::import("tether.errors").attr("from_code");
      py::object exc = make(CodeName(e.status.code()), e.status.message());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())),
                      exc.ptr());
    }
  });

  py::class_<PyFuture>(m, "Future",
                       "An asynchronous request; result() waits for it.")
      .def("done", &PyFuture::done)
      .def("result", &PyFuture::result, py::arg("timeout") = py::none(),
           "Waits for the request (Ctrl-C interrupts the wait) and returns "
           "its value, or raises its tether.Error.");

  py::class_<PyClient> client(m, "Client");
  client
      .def(py::init([](const std::string& coordinator, int staleness, int rank,
                       bool observer, std::optional<std::string> auth_key_file,
                       std::optional<std::string> name, int join_timeout_ms,
                       int reconnect_timeout_ms,
                       std::optional<std::string> command,
                       const std::optional<std::string>& tls_cert,
                       const std::optional<std::string>& tls_key,
                       const std::optional<std::string>& tls_ca,
                       const std::optional<std::string>& manifest,
                       const std::string& wire_dtype) {
             ClientOptions o;
             Result<WireDtype> dtype = ParseWireDtype(wire_dtype, "wire_dtype");
             if (!dtype.ok()) throw py::value_error(dtype.status().message());
             o.wire_dtype = *dtype;
             o.coordinator = coordinator;
             o.staleness = staleness;
             o.rank = rank;
             o.observer = observer;
             if (auth_key_file) o.auth_key_file = *auth_key_file;
             o.name = name ? *name : "python";
             o.join_timeout_ms = join_timeout_ms;
             o.reconnect_timeout_ms = reconnect_timeout_ms;
             if (command) o.command = *command;
             o.tls.cert_file = tls_cert.value_or("");
             o.tls.key_file = tls_key.value_or("");
             o.tls.ca_file = tls_ca.value_or("");
             o.manifest = manifest.value_or("");
             return std::make_unique<PyClient>(std::move(o));
           }),
           py::arg("coordinator"), py::arg("staleness") = 0,
           py::arg("rank") = -1, py::arg("observer") = false,
           py::arg("auth_key_file") = py::none(), py::arg("name") = py::none(),
           py::arg("join_timeout_ms") = 600000,
           py::arg("reconnect_timeout_ms") = 120000,
           py::arg("command") = py::none(), py::arg("tls_cert") = py::none(),
           py::arg("tls_key") = py::none(), py::arg("tls_ca") = py::none(),
           py::arg("manifest") = py::none(), py::arg("wire_dtype") = "f32")
      .def("close", &PyClient::Close)
      .def_property_readonly("closed",
                             [](PyClient& self) {
                               try {
                                 self.c();
                                 return false;
                               } catch (const StatusError&) {
                                 return true;
                               }
                             })
      .def("define_tensor", &PyClient::DefineTensor)
      .def("define_table", &PyClient::DefineTable)
      .def("rows_async",
           [](const py::object& self, int op, const std::string& table,
              const py::object& keys, const py::object& rows) {
             return PyFuture(
                 self.cast<PyClient&>().RowsStart(table, keys, rows, op), self);
           })
      .def("rows",
           [](PyClient& self, int op, const std::string& table,
              const py::object& keys, const py::object& rows) {
             self.Wait(self.RowsStart(table, keys, rows, op));
           })
      .def("push_many",
           [](const py::object& self, const std::vector<std::string>& names,
              const py::list& buffers, bool clock) {
             return PyFuture(self.cast<PyClient&>().ManyStart(
                                 Dense::kPush, names, buffers, clock),
                             self);
           })
      .def("push_and_prefetch",
           [](const py::object& self, const std::string& name,
              const py::object& grad, const py::object& out) {
             auto [pushed, fetched] =
                 self.cast<PyClient&>().PushAndPrefetchStart(name, grad, out);
             return py::make_tuple(PyFuture(pushed, self),
                                   PyFuture(fetched, self));
           })
      .def("clock", [](PyClient& self) { self.Wait(self.ClockStart()); })
      .def("clock_async",
           [](const py::object& self) {
             return PyFuture(self.cast<PyClient&>().ClockStart(), self);
           })
      .def("report",
           [](PyClient& self, int epoch, uint64_t samples, float loss,
              float samples_per_s, float test_accuracy, float test_loss,
              const std::string& device, const std::string& host,
              float wait_fraction, bool done) {
             Progress p;
             p.epoch = epoch;
             p.samples = samples;
             p.loss = loss;
             p.samples_per_s = samples_per_s;
             p.test_accuracy = test_accuracy;
             p.test_loss = test_loss;
             p.device = device;
             p.host = host;
             p.wait_fraction = wait_fraction;
             p.done = done;
             self.Blocking([&](Client& c, Client::Callback cb) {
               c.ReportAsync(p, std::move(cb));
             });
           })
      .def(
          "next_chunk",
          [](PyClient& self, uint64_t rows, uint32_t chunk_rows, int epochs,
             uint32_t batch) {
            auto chunk = Value(self.Released([&](Client& c) {
              return c.NextChunk(rows, chunk_rows, epochs, batch);
            }));
            return py::make_tuple(chunk.epoch, chunk.index, chunk.first,
                                  chunk.count, chunk.finished);
          },
          py::arg("rows"), py::arg("chunk_rows"), py::arg("epochs"),
          py::arg("batch") = 0)
      .def("share",
           [](PyClient& self, int epoch, uint32_t batch) {
             auto share = Value(self.Released(
                 [&](Client& c) { return c.Share(epoch, batch); }));
             return py::make_tuple(share.decided, share.index, share.members,
                                   share.start_clock);
           })
      .def("take_leftover",
           [](PyClient& self, int epoch) {
             auto part = Value(self.Released(
                 [&](Client& c) { return c.TakeLeftover(epoch); }));
             return py::make_tuple(part.epoch, part.index, part.members,
                                   part.first_row);
           })
      .def("set_share_position",
           [](PyClient& self, int epoch, int index, int members,
              uint64_t first_row) {
             self.c().SetSharePosition({epoch, index, members, first_row});
           })
      .def("leave",
           [](PyClient& self, const std::string& reason, bool finished) {
             Check(self.Released(
                 [&](Client& c) { return c.Leave(reason, finished); }));
           })
      .def("request_stop",
           [](PyClient& self, const std::string& reason) {
             self.c().RequestStop(reason);
           })
      .def("stats",
           [](PyClient& self) {
             auto stats =
                 Value(self.Released([](Client& c) { return c.Stats(); }));
             py::list out;
             for (const ShardStats& s : stats) out.append(StatsDict(s));
             return out;
           })
      .def("checkpoint_now",
           [](PyClient& self) {
             return Value(
                 self.Released([](Client& c) { return c.CheckpointNow(); }));
           })
      .def("await_shards",
           [](PyClient& self, int timeout_ms) {
             Check(self.Released(
                 [&](Client& c) { return c.AwaitShards(timeout_ms); }));
           })
      .def_property_readonly(
          "shard_losses",
          [](PyClient& self) { return self.c().shard_losses(); })
      .def_property_readonly(
          "stop_requested",
          [](PyClient& self) { return self.c().stop_requested(); })
      .def_property_readonly(
          "stop_reason", [](PyClient& self) { return self.c().stop_reason(); })
      .def_property_readonly("rank",
                             [](PyClient& self) { return self.c().rank(); })
      .def_property_readonly(
          "num_workers", [](PyClient& self) { return self.c().num_workers(); })
      .def_property_readonly(
          "num_shards", [](PyClient& self) { return self.c().num_shards(); })
      .def_property_readonly("seed",
                             [](PyClient& self) { return self.c().seed(); })
      .def_property_readonly(
          "staleness", [](PyClient& self) { return self.c().staleness(); })
      .def_property_readonly("clocks",
                             [](PyClient& self) { return self.c().clock(); })
      .def_property_readonly(
          "resume_round",
          [](PyClient& self) { return self.c().resume_round(); })
      .def_property_readonly("records",
                             [](PyClient& self) { return self.c().records(); })
      .def_property_readonly("max_push_staleness", [](PyClient& self) {
        return self.c().max_push_staleness();
      });
  // pull, push, provide and assign, each blocking and _async.
  struct DenseMethod {
    const char* name;
    const char* async_name;
    Dense op;
  };
  for (const DenseMethod& d :
       {DenseMethod{"pull", "pull_async", Dense::kPull},
        DenseMethod{"push", "push_async", Dense::kPush},
        DenseMethod{"provide", "provide_async", Dense::kProvide},
        DenseMethod{"assign", "assign_async", Dense::kAssign}}) {
    client.def(d.name, [op = d.op](PyClient& self, const std::string& name,
                                   const py::object& buffer) {
      self.Wait(self.DenseStart(op, name, buffer));
    });
    client.def(d.async_name,
               [op = d.op](const py::object& self, const std::string& name,
                           const py::object& buffer) {
                 return PyFuture(
                     self.cast<PyClient&>().DenseStart(op, name, buffer), self);
               });
  }
  // pull_many, prefetch_many and assign_many (push_many, above, also takes
  // the clock).
  for (const DenseMethod& d :
       {DenseMethod{"pull_many", nullptr, Dense::kPull},
        DenseMethod{"prefetch_many", nullptr, Dense::kPrefetch},
        DenseMethod{"assign_many", nullptr, Dense::kAssign}}) {
    client.def(d.name, [op = d.op](const py::object& self,
                                   const std::vector<std::string>& names,
                                   const py::list& buffers) {
      return PyFuture(
          self.cast<PyClient&>().ManyStart(op, names, buffers, false), self);
    });
  }

  m.def(
      "wait_seconds", [] { return g_wait_ns.load() * 1e-9; },
      "Seconds Python threads have spent blocked on tether requests (the "
      "wire and the shards) so far.");
  m.def(
      "worker_share",
      [](uint64_t rows, int rank, int workers, uint64_t seed, int epoch) {
        std::vector<uint32_t> order =
            WorkerShare(rows, rank, workers, seed, epoch);
        return py::array_t<uint32_t>(order.size(), order.data());
      },
      py::arg("rows"), py::arg("rank"), py::arg("workers"), py::arg("seed"),
      py::arg("epoch"),
      "This worker's rows of an epoch, in order: the whole epoch's order "
      "(rank 0 of 1 worker) is what chunks index into.");
  m.def(
      "load_fashion_mnist",
      [](bool train) {
        auto d = Value(LoadFashionMnist(train));
        return DatasetArrays(std::move(d));
      },
      py::arg("train") = true,
      "(x float32 [rows, 784] in [0, 1], y int32 [rows], classes) from "
      "Debian's dataset-fashion-mnist package.");
  m.def(
      "load_idx",
      [](const std::string& images, const std::string& labels) {
        auto d = Value(LoadIdx(images, labels));
        return DatasetArrays(std::move(d));
      },
      py::arg("images"), py::arg("labels"));
}
