#include "server/param_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace tether {
namespace {

// Sparse rows live in chunks of about this many floats: no reallocation (and
// no doubled peak memory) as a table grows, at most one partly used chunk
// per table, and pages of the unused tail are never touched.
constexpr size_t kChunkFloats = size_t{1} << 16;

// Inits arrive from the network: an unknown kind or a NaN scale would
// otherwise become weights that poison every later update.
Status CheckInit(const std::string& what, const InitSpec& init) {
  switch (init.kind) {
    case InitSpec::Kind::kZeros:
    case InitSpec::Kind::kConstant:
    case InitSpec::Kind::kProvided:
      break;
    case InitSpec::Kind::kUniform:
    case InitSpec::Kind::kNormal:
      if (init.scale < 0) {
        return InvalidArgument(what + ": init " + InitString(init) +
                               " has a negative scale");
      }
      break;
    default:
      return InvalidArgument(what + ": unknown init " + InitString(init));
  }
  if (!std::isfinite(init.scale)) {
    return InvalidArgument(what + ": init " + InitString(init) +
                           " is not finite");
  }
  return Status::Ok();
}

// A snapshot's block or row whose slots do not suit this store's optimizer
// (e.g. Adam's restored into SGD).
Status SlotMismatch(const std::string& what, size_t got, size_t need,
                    OptimizerKind kind) {
  return InvalidArgument(what + " has " + std::to_string(got) +
                         " slot floats, the " + OptimizerName(kind) +
                         " optimizer needs " + std::to_string(need));
}

Status ShapeMismatch(std::string message) {
  return Status(Code::kShapeMismatch, std::move(message));
}

// A provided tensor's block or table's row read or updated before its
// provider wrote it.
Status NotReady(const std::string& what, const std::string& part) {
  return Status(Code::kNotReady,
                what + " " + part +
                    " has no values yet: its init is 'provided' and the "
                    "worker that provides them (rank 0) has not written "
                    "them; pull again shortly");
}

}  // namespace

uint32_t NameId(const std::string& name) {
  uint32_t h = 2166136261u;
  for (unsigned char c : name) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string InitString(const InitSpec& init) {
  std::ostringstream s;
  switch (init.kind) {
    case InitSpec::Kind::kZeros:
      return "zeros";
    case InitSpec::Kind::kProvided:
      return "provided";
    case InitSpec::Kind::kUniform:
      s << "uniform(" << init.scale << ")";
      break;
    case InitSpec::Kind::kNormal:
      s << "normal(" << init.scale << ")";
      break;
    case InitSpec::Kind::kConstant:
      s << "constant(" << init.scale << ")";
      break;
    default:
      s << "kind " << static_cast<int>(init.kind);
  }
  return s.str();
}

struct ParamStore::Block {
  uint64_t step = 0;
  uint32_t len = 0;
  // Weights and slots are shared with frames being sent (ShareBlock) and
  // with checkpoint snapshots being written (Snapshot). An update writes
  // into them only while no one shares them; else it writes new buffers
  // and swaps them in (ApplyBlocks).
  std::shared_ptr<float[]> weights_owner;
  std::shared_ptr<float[]> slots_owner;
  size_t slots_len = 0;
  // At least the magnitude of every weight and slot, or +Inf when not
  // known (Optimizer::Apply keeps it; out-of-place updates forget it).
  float bound = std::numeric_limits<float>::infinity();

  std::span<float> weights() { return {weights_owner.get(), len}; }
  std::span<float> slots() { return {slots_owner.get(), slots_len}; }
};

struct ParamStore::Tensor {
  uint32_t id = 0;
  std::string name;
  std::vector<uint64_t> shape;
  InitSpec init;
  uint64_t numel = 0;
  uint64_t num_blocks = 0;
  uint64_t floats_held = 0;
  // Only the blocks this shard was asked for, so a shard of a huge tensor
  // pays nothing for the blocks that live elsewhere.
  std::unordered_map<uint32_t, Block> blocks;

  std::string What() const { return "tensor '" + name + "'"; }
  uint32_t BlockLen(uint32_t block, uint32_t block_size) const {
    return static_cast<uint32_t>(
        std::min<uint64_t>(numel - uint64_t{block} * block_size, block_size));
  }

  bool provided() const { return init.kind == InitSpec::Kind::kProvided; }

  // Block `block` (already checked to exist), created on first touch with
  // its initial values, or with `values` when given (a provided tensor's).
  Block& Touch(uint32_t block, uint32_t block_size, uint64_t seed,
               int slots_per_weight, const float* values = nullptr) {
    auto [it, inserted] = blocks.try_emplace(block);
    Block& b = it->second;
    if (inserted) {
      b.len = BlockLen(block, block_size);
      const size_t floats = size_t{b.len} * (1 + slots_per_weight);
      b.weights_owner.reset(new float[b.len]);
      // Value-initialized, so the slots start at zero.
      b.slots_len = size_t{b.len} * slots_per_weight;
      b.slots_owner.reset(new float[b.slots_len]());  // zeroed
      if (values != nullptr) {
        std::copy_n(values, b.len, b.weights_owner.get());
      } else {
        FillInitial(init, seed, id, uint64_t{block} * block_size, b.weights());
      }
      floats_held += floats;
    }
    return b;
  }

  // kNotReady if `block` of a provided tensor has no values yet.
  Status Ready(uint32_t block) const {
    if (!provided() || blocks.contains(block)) return Status::Ok();
    return NotReady(What(), "block " + std::to_string(block));
  }
};

struct ParamStore::Table {
  uint32_t id = 0;
  std::string name;
  uint32_t dim = 0;
  InitSpec init;
  size_t stride = 0;  // dim weights then the slots, per row
  size_t rows_per_chunk = 0;
  std::unordered_map<uint64_t, uint64_t> row_of_key;
  std::vector<std::unique_ptr<float[]>> chunks;
  std::vector<uint64_t> steps;  // per row

  std::string What() const { return "table '" + name + "'"; }
  uint64_t rows() const { return steps.size(); }
  float* Row(uint64_t r) {
    return chunks[r / rows_per_chunk].get() + (r % rows_per_chunk) * stride;
  }
  const float* Row(uint64_t r) const {
    return chunks[r / rows_per_chunk].get() + (r % rows_per_chunk) * stride;
  }

  // Appends row `r` (== rows()) with update count `step`; the caller fills
  // it.
  float* Append(uint64_t r, uint64_t step) {
    if (r % rows_per_chunk == 0) {
      chunks.push_back(
          std::make_unique_for_overwrite<float[]>(rows_per_chunk * stride));
    }
    steps.push_back(step);
    return Row(r);
  }

  bool provided() const { return init.kind == InitSpec::Kind::kProvided; }

  // The row index of `key`, creating and initializing the row if missing
  // (with `values` when given: a provided table's).
  uint64_t Touch(uint64_t key, uint64_t seed, const float* values = nullptr) {
    auto [it, inserted] = row_of_key.try_emplace(key, rows());
    const uint64_t r = it->second;
    if (!inserted) return r;
    float* row = Append(r, 0);
    if (values != nullptr) {
      std::copy_n(values, dim, row);
    } else {
      // Wrapping u64 arithmetic on purpose: keys are arbitrary u64s (often
      // hashes) and must still map to some fixed index range.
      FillInitial(init, seed, id, key * uint64_t{dim}, {row, dim});
    }
    std::fill(row + dim, row + stride, 0.0f);
    return r;
  }

  // kNotReady if a provided table has no row for one of `keys` yet.
  Status Ready(std::span<const uint64_t> keys) const {
    if (!provided()) return Status::Ok();
    for (uint64_t key : keys) {
      if (!row_of_key.contains(key)) {
        return NotReady(What(), "row " + std::to_string(key));
      }
    }
    return Status::Ok();
  }
};

ParamStore::ParamStore(uint64_t seed, uint32_t block_size,
                       OptimizerOptions optimizer)
    : seed_(seed),
      // A block size of 0 is meaningless; one-float blocks beat dividing by
      // zero.
      block_size_(std::max<uint32_t>(block_size, 1)),
      optimizer_(optimizer) {}

ParamStore::~ParamStore() = default;

Status ParamStore::CheckIdFree(const std::string& kind, const std::string& name,
                               uint32_t id) const {
  const std::string* other = nullptr;
  const char* other_kind = "";
  if (auto it = tensors_.find(id); it != tensors_.end()) {
    other = &it->second->name;
    other_kind = "tensor";
  } else if (auto it = tables_.find(id); it != tables_.end()) {
    other = &it->second->name;
    other_kind = "table";
  }
  if (other == nullptr) return Status::Ok();
  if (*other != name) {
    return InvalidArgument(kind + " '" + name + "' has id " +
                           std::to_string(id) + ", the same as " + other_kind +
                           " '" + *other + "'; rename one");
  }
  return ShapeMismatch(kind + " '" + name + "' is already defined as a " +
                       other_kind);
}

Result<uint32_t> ParamStore::DefineTensor(const std::string& name,
                                          const std::vector<uint64_t>& shape,
                                          const InitSpec& init,
                                          bool require_same_init) {
  if (name.empty()) return InvalidArgument("tensor name is empty");
  const std::string what = "tensor '" + name + "'";
  if (shape.empty()) return InvalidArgument(what + ": shape is empty");
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) {
      return InvalidArgument(what + ": dimension " + std::to_string(i) +
                             " is zero in shape " + ShapeString(shape));
    }
    if (__builtin_mul_overflow(numel, shape[i], &numel)) {
      return InvalidArgument(what + ": shape " + ShapeString(shape) +
                             " has more than 2^64 elements");
    }
  }
  TETHER_RETURN_IF_ERROR(CheckInit(what, init));

  const uint32_t id = NameId(name);
  if (auto it = tensors_.find(id);
      it != tensors_.end() && it->second->name == name) {
    const Tensor& t = *it->second;
    if (t.shape == shape && (t.init == init || !require_same_init)) return id;
    return ShapeMismatch(what + " is already defined with shape " +
                         ShapeString(t.shape) + " and init " +
                         InitString(t.init) + ", not shape " +
                         ShapeString(shape) + " and init " + InitString(init));
  }
  TETHER_RETURN_IF_ERROR(CheckIdFree("tensor", name, id));

  // Written this way round so numel near 2^64 cannot overflow.
  const uint64_t num_blocks = (numel - 1) / block_size_ + 1;
  if (num_blocks > (uint64_t{1} << 32)) {
    return InvalidArgument(what + ": " + std::to_string(numel) +
                           " floats make more than 2^32 blocks of " +
                           std::to_string(block_size_));
  }
  auto t = std::make_unique<Tensor>();
  t->id = id;
  t->name = name;
  t->shape = shape;
  t->init = init;
  t->numel = numel;
  t->num_blocks = num_blocks;
  tensors_.emplace(id, std::move(t));
  return id;
}

Result<uint32_t> ParamStore::DefineTable(const std::string& name, uint32_t dim,
                                         const InitSpec& init,
                                         bool require_same_init) {
  if (name.empty()) return InvalidArgument("table name is empty");
  const std::string what = "table '" + name + "'";
  if (dim == 0) return InvalidArgument(what + ": dim is zero");
  TETHER_RETURN_IF_ERROR(CheckInit(what, init));

  const uint32_t id = NameId(name);
  if (auto it = tables_.find(id);
      it != tables_.end() && it->second->name == name) {
    const Table& t = *it->second;
    if (t.dim == dim && (t.init == init || !require_same_init)) return id;
    return ShapeMismatch(what + " is already defined with dim " +
                         std::to_string(t.dim) + " and init " +
                         InitString(t.init) + ", not dim " +
                         std::to_string(dim) + " and init " + InitString(init));
  }
  TETHER_RETURN_IF_ERROR(CheckIdFree("table", name, id));

  auto t = std::make_unique<Table>();
  t->id = id;
  t->name = name;
  t->dim = dim;
  t->init = init;
  t->stride = size_t{dim} * (1 + optimizer_.slots_per_weight());
  t->rows_per_chunk = std::max<size_t>(1, kChunkFloats / t->stride);
  tables_.emplace(id, std::move(t));
  return id;
}

Result<ParamStore::Tensor*> ParamStore::FindBlock(uint32_t tensor,
                                                  uint32_t block) {
  auto it = tensors_.find(tensor);
  if (it == tensors_.end()) {
    return NotFound("unknown tensor id " + std::to_string(tensor));
  }
  Tensor& t = *it->second;
  if (block >= t.num_blocks) {
    return InvalidArgument(t.What() + ": block " + std::to_string(block) +
                           " is past the end (" + std::to_string(t.num_blocks) +
                           " blocks)");
  }
  return &t;
}

Result<std::span<const float>> ParamStore::ReadBlock(uint32_t tensor,
                                                     uint32_t block) {
  TETHER_ASSIGN_OR_RETURN(Tensor * t, FindBlock(tensor, block));
  TETHER_RETURN_IF_ERROR(t->Ready(block));
  Block& b = t->Touch(block, block_size_, seed_, optimizer_.slots_per_weight());
  return std::span<const float>(b.weights());
}

Result<ParamStore::SharedBlock> ParamStore::ShareBlock(uint32_t tensor,
                                                       uint32_t block) {
  TETHER_ASSIGN_OR_RETURN(Tensor * t, FindBlock(tensor, block));
  TETHER_RETURN_IF_ERROR(t->Ready(block));
  Block& b = t->Touch(block, block_size_, seed_, optimizer_.slots_per_weight());
  return SharedBlock{b.weights_owner, std::span<const float>(b.weights())};
}

Status ParamStore::ApplyBlock(uint32_t tensor, uint32_t block,
                              std::span<const float> grad, float lr_scale) {
  const BlockGrad one{block, grad};
  return ApplyBlocks(tensor, std::span(&one, 1), lr_scale, nullptr);
}

namespace {

// Whether no frame or snapshot shares `buffer` any more, so that it may be
// written. use_count() is a relaxed read: it does not order the writes to
// come after the last reader's (a reply's send on another thread). Copying
// and dropping the pointer does: the drop's decrement is an acquire on the
// count that reader released. (A fence would too, but ThreadSanitizer
// cannot see fences.)
bool Exclusive(const std::shared_ptr<float[]>& buffer) {
  if (buffer.use_count() != 1) return false;
  { std::shared_ptr<float[]> acquire = buffer; }
  return true;
}

// A buffer an update writes into, with its length.
struct Buffer {
  std::shared_ptr<float[]> data;
  size_t len = 0;

  // Whether it is `n` floats that no one else reads.
  bool Fits(size_t n) const { return n == len && (n == 0 || Exclusive(data)); }
};

}  // namespace

Status ParamStore::ApplyBlocks(uint32_t tensor,
                               std::span<const BlockGrad> grads, float lr_scale,
                               ApplyPool* pool) {
  struct Job {
    uint32_t index;
    Block* block;
    std::span<const float> grad;
    float grad_bound;
    bool in_place;  // no frame or snapshot shares the block's buffers
    bool finite = false;
  };
  std::vector<Job> jobs;
  jobs.reserve(grads.size());
  Status first;  // the first error; every other block still applies
  Tensor* t = nullptr;
  size_t floats = 0;
  for (const BlockGrad& g : grads) {
    Result<Tensor*> found = FindBlock(tensor, g.block);
    if (!found.ok()) {
      if (first.ok()) first = found.status();
      continue;
    }
    t = *found;
    // Checked before Touch so that a rejected push creates nothing.
    const uint32_t len = t->BlockLen(g.block, block_size_);
    Status s;
    if (g.grad.size() != len) {
      s = InvalidArgument(t->What() + ": block " + std::to_string(g.block) +
                          " has " + std::to_string(len) +
                          " floats, the gradient " +
                          std::to_string(g.grad.size()));
    } else {
      s = t->Ready(g.block);
    }
    if (!s.ok()) {
      if (first.ok()) first = s;
      continue;
    }
    Block& b =
        t->Touch(g.block, block_size_, seed_, optimizer_.slots_per_weight());
    const bool in_place = (b.len == 0 || Exclusive(b.weights_owner)) &&
                          (b.slots_len == 0 || Exclusive(b.slots_owner));
    jobs.push_back({g.block, &b, g.grad, g.bound, in_place});
    floats += b.len;
  }
  if (jobs.empty()) return first;

  // Each part updates a run of blocks in turn. A block whose buffers no
  // frame or snapshot shares is updated in place (Optimizer::Apply, which
  // checks every new value before it writes one). Any other is updated out
  // of place: into buffers that replace the block's only when every new
  // value is finite, so a refused update leaves the block as it was, and
  // buffers a frame or a snapshot still holds are never written; the
  // block's old buffers serve the part's next such block when no one else
  // holds them.
  int parts = 1;
  if (pool != nullptr && pool->threads() > 1 &&
      floats >= kParallelApplyFloats) {
    parts = static_cast<int>(
        std::min<size_t>(static_cast<size_t>(pool->threads()), jobs.size()));
    // Parts must not share a block: a block pushed twice in one push is
    // applied twice, in order, by one thread.
    std::vector<uint32_t> indices(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) indices[i] = jobs[i].index;
    std::sort(indices.begin(), indices.end());
    if (std::adjacent_find(indices.begin(), indices.end()) != indices.end()) {
      parts = 1;
    }
  }
  // Runs of about the same number of floats.
  std::vector<size_t> bounds(parts + 1, jobs.size());
  bounds[0] = 0;
  for (size_t i = 0, sum = 0, part = 1;
       i < jobs.size() && part < bounds.size() - 1; ++i) {
    sum += jobs[i].block->len;
    if (sum * parts >= floats * part) bounds[part++] = i + 1;
  }
  std::vector<std::pair<Buffer, Buffer>> buffers(parts);
  for (int p = 0; p < parts; ++p) {
    const Job& j = jobs[bounds[p]];
    if (j.in_place) continue;  // a later block takes them if it needs
    const Block& b = *j.block;
    buffers[p].first = {TakeSpare(b.len), b.len};
    buffers[p].second = {TakeSpare(b.slots_len), b.slots_len};
  }
  // A buffer that does not fit the next block is swapped for one from the
  // spares (one thread) or a new one (several: the spares are not theirs).
  auto fit = [&](Buffer& buffer, size_t n) {
    if (buffer.Fits(n)) return;
    if (parts == 1) {
      GiveSpare(std::move(buffer.data), buffer.len);
      buffer = {TakeSpare(n), n};
    } else {
      buffer = {n == 0 ? nullptr : std::shared_ptr<float[]>(new float[n]), n};
    }
  };
  auto run = [&](int p) {
    auto& [weights, slots] = buffers[p];
    for (size_t i = bounds[p]; i < bounds[p + 1]; ++i) {
      Job& j = jobs[i];
      Block& b = *j.block;
      if (j.in_place) {
        j.finite = optimizer_.Apply(
            {b.weights_owner.get(), b.len}, {b.slots_owner.get(), b.slots_len},
            j.grad, b.step + 1, lr_scale, &b.bound, j.grad_bound);
        if (j.finite) ++b.step;
        continue;
      }
      fit(weights, b.len);
      fit(slots, b.slots_len);
      j.finite = optimizer_.Update(
          b.weights(), b.slots(), j.grad, {weights.data.get(), b.len},
          {slots.data.get(), b.slots_len}, b.step + 1, lr_scale);
      if (!j.finite) continue;
      ++b.step;
      b.bound = std::numeric_limits<float>::infinity();
      std::swap(b.weights_owner, weights.data);
      std::swap(b.slots_owner, slots.data);
    }
  };
  if (parts == 1) {
    run(0);
  } else {
    pool->Run(parts, run);
  }
  for (auto& [weights, slots] : buffers) {
    GiveSpare(std::move(weights.data), weights.len);
    GiveSpare(std::move(slots.data), slots.len);
  }
  for (const Job& j : jobs) {
    if (j.finite || !first.ok()) continue;
    first = Status(Code::kNonFinite,
                   t->What() + " block " + std::to_string(j.index) +
                       ": the update would make a weight or optimizer slot "
                       "non-finite (overflow); refused, the block is "
                       "unchanged");
  }
  return first;
}

std::shared_ptr<float[]> ParamStore::TakeSpare(size_t n) {
  if (n == 0) return nullptr;
  std::vector<std::shared_ptr<float[]>>& spares = spares_[n];
  for (auto& spare : spares) {
    // One that a frame or snapshot still shares cannot be written.
    if (Exclusive(spare)) {
      std::shared_ptr<float[]> taken = std::move(spare);
      std::swap(spare, spares.back());
      spares.pop_back();
      return taken;
    }
  }
  return std::shared_ptr<float[]>(new float[n]);
}

void ParamStore::GiveSpare(std::shared_ptr<float[]> buffer, size_t n) {
  if (n == 0 || !buffer) return;
  // Weights and slots may have the same length: room for both.
  std::vector<std::shared_ptr<float[]>>& spares = spares_[n];
  if (spares.size() < 2) {
    spares.push_back(std::move(buffer));
  } else {
    spares.front() = std::move(buffer);
  }
}

Result<ParamStore::Table*> ParamStore::FindTable(uint32_t table, size_t keys,
                                                 size_t floats,
                                                 const char* buffer) {
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return NotFound("unknown table id " + std::to_string(table));
  }
  Table& t = *it->second;
  if (floats != keys * t.dim) {
    return InvalidArgument(t.What() + ": " + std::to_string(keys) +
                           " keys of dim " + std::to_string(t.dim) + " need " +
                           std::to_string(keys * t.dim) + " floats, " + buffer +
                           " has " + std::to_string(floats));
  }
  return &t;
}

Status ParamStore::ReadRows(uint32_t table, std::span<const uint64_t> keys,
                            std::span<float> out) {
  TETHER_ASSIGN_OR_RETURN(Table * found,
                          FindTable(table, keys.size(), out.size(), "output"));
  Table& t = *found;
  TETHER_RETURN_IF_ERROR(t.Ready(keys));
  for (size_t i = 0; i < keys.size(); ++i) {
    const float* row = t.Row(t.Touch(keys[i], seed_));
    std::memcpy(out.data() + i * t.dim, row, t.dim * sizeof(float));
  }
  return Status::Ok();
}

Status ParamStore::ApplyRows(uint32_t table, std::span<const uint64_t> keys,
                             std::span<const float> grads, float lr_scale) {
  TETHER_ASSIGN_OR_RETURN(
      Table * found, FindTable(table, keys.size(), grads.size(), "gradient"));
  Table& t = *found;
  TETHER_RETURN_IF_ERROR(t.Ready(keys));
  // Rows are updated in place (pulls copy them out, no frame shares
  // them); one whose update would make it non-finite is left as it was.
  uint64_t refused = 0, first_refused = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t r = t.Touch(keys[i], seed_);
    float* row = t.Row(r);
    if (optimizer_.Apply({row, t.dim}, {row + t.dim, t.stride - t.dim},
                         grads.subspan(i * t.dim, t.dim), t.steps[r] + 1,
                         lr_scale)) {
      ++t.steps[r];
    } else if (refused++ == 0) {
      first_refused = keys[i];
    }
  }
  if (refused > 0) {
    return Status(Code::kNonFinite,
                  t.What() + ": the update of " + std::to_string(refused) +
                      " row(s) (first: key " + std::to_string(first_refused) +
                      ") would make a weight or optimizer slot non-finite "
                      "(overflow); those rows are unchanged");
  }
  return Status::Ok();
}

Status ParamStore::ProvideBlock(uint32_t tensor, uint32_t block,
                                std::span<const float> values) {
  TETHER_ASSIGN_OR_RETURN(Tensor * found, FindBlock(tensor, block));
  Tensor& t = *found;
  if (!t.provided()) {
    return InvalidArgument(t.What() + " has init " + InitString(t.init) +
                           ", not 'provided': its values cannot be provided");
  }
  const uint32_t len = t.BlockLen(block, block_size_);
  if (values.size() != len) {
    return InvalidArgument(t.What() + ": block " + std::to_string(block) +
                           " has " + std::to_string(len) +
                           " floats, the values provided " +
                           std::to_string(values.size()));
  }
  t.Touch(block, block_size_, seed_, optimizer_.slots_per_weight(),
          values.data());
  return Status::Ok();
}

Status ParamStore::AssignBlock(uint32_t tensor, uint32_t block,
                               std::span<const float> values) {
  TETHER_ASSIGN_OR_RETURN(Tensor * t, FindBlock(tensor, block));
  const uint32_t len = t->BlockLen(block, block_size_);
  if (values.size() != len) {
    return InvalidArgument(t->What() + ": block " + std::to_string(block) +
                           " has " + std::to_string(len) +
                           " floats, the values assigned " +
                           std::to_string(values.size()));
  }
  Block& b = t->Touch(block, block_size_, seed_, optimizer_.slots_per_weight(),
                      values.data());
  if (!Exclusive(b.weights_owner)) {
    // A frame or a snapshot still reads the old values.
    b.weights_owner.reset(new float[len]);
  }
  std::copy(values.begin(), values.end(), b.weights().begin());
  return Status::Ok();
}

Status ParamStore::ProvideRows(uint32_t table, std::span<const uint64_t> keys,
                               std::span<const float> values) {
  TETHER_ASSIGN_OR_RETURN(
      Table * found, FindTable(table, keys.size(), values.size(), "values"));
  Table& t = *found;
  if (!t.provided()) {
    return InvalidArgument(t.What() + " has init " + InitString(t.init) +
                           ", not 'provided': its values cannot be provided");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    t.Touch(keys[i], seed_, values.data() + i * t.dim);
  }
  return Status::Ok();
}

Status ParamStore::Ready(uint32_t id, std::span<const uint32_t> blocks,
                         std::span<const uint64_t> keys) const {
  if (auto it = tensors_.find(id); it != tensors_.end()) {
    for (uint32_t block : blocks) {
      TETHER_RETURN_IF_ERROR(it->second->Ready(block));
    }
  }
  if (auto it = tables_.find(id); it != tables_.end()) {
    return it->second->Ready(keys);
  }
  return Status::Ok();
}

std::string ParamStore::NameOf(uint32_t id) const {
  if (auto it = tensors_.find(id); it != tensors_.end()) {
    return it->second->name;
  }
  if (auto it = tables_.find(id); it != tables_.end()) return it->second->name;
  return "id " + std::to_string(id);
}

Result<uint32_t> ParamStore::TableDim(uint32_t table) const {
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return NotFound("unknown table id " + std::to_string(table));
  }
  return it->second->dim;
}

Result<uint64_t> ParamStore::TensorSize(uint32_t tensor) const {
  auto it = tensors_.find(tensor);
  if (it == tensors_.end()) {
    return NotFound("unknown tensor id " + std::to_string(tensor));
  }
  return it->second->numel;
}

namespace {

// The values of an id-keyed map of unique_ptrs, in id order.
template <typename T>
std::vector<const T*> SortedById(
    const std::unordered_map<uint32_t, std::unique_ptr<T>>& by_id) {
  std::vector<const T*> sorted;
  sorted.reserve(by_id.size());
  for (const auto& [id, item] : by_id) sorted.push_back(item.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const T* a, const T* b) { return a->id < b->id; });
  return sorted;
}

}  // namespace

void ParamStore::Snapshot(std::vector<TensorSnapshot>* tensors,
                          std::vector<TableSnapshot>* tables) const {
  // Sorted throughout, so that equal stores give equal snapshots whatever
  // the hash maps' order.
  tensors->clear();
  tables->clear();
  tensors->reserve(tensors_.size());
  for (const Tensor* t : SortedById(tensors_)) {
    TensorSnapshot& out = tensors->emplace_back();
    out.id = t->id;
    out.name = t->name;
    out.shape = t->shape;
    out.init = t->init;
    std::vector<uint32_t> indices;
    indices.reserve(t->blocks.size());
    for (const auto& [index, block] : t->blocks) indices.push_back(index);
    std::sort(indices.begin(), indices.end());
    out.blocks.reserve(indices.size());
    for (uint32_t index : indices) {
      const Block& b = t->blocks.at(index);
      out.blocks.push_back(TensorSnapshot::Block::Shared(
          index, b.step, b.weights_owner, b.len, b.slots_owner, b.slots_len));
    }
  }

  tables->reserve(tables_.size());
  for (const Table* t : SortedById(tables_)) {
    TableSnapshot& out = tables->emplace_back();
    out.id = t->id;
    out.name = t->name;
    out.dim = t->dim;
    out.init = t->init;
    std::vector<std::pair<uint64_t, uint64_t>> keys(t->row_of_key.begin(),
                                                    t->row_of_key.end());
    std::sort(keys.begin(), keys.end());
    out.rows.reserve(keys.size());
    for (const auto& [key, r] : keys) {
      const float* row = t->Row(r);
      out.rows.push_back({key, t->steps[r],
                          std::vector<float>(row, row + t->dim),
                          std::vector<float>(row + t->dim, row + t->stride)});
    }
  }
}

Status ParamStore::Restore(const std::vector<TensorSnapshot>& tensors,
                           const std::vector<TableSnapshot>& tables) {
  // Built aside and swapped in at the end, so an error leaves this store as
  // it was. Definitions go through DefineTensor/DefineTable for their checks.
  ParamStore fresh(seed_, block_size_, optimizer_.options());
  const size_t slots_per_weight = optimizer_.slots_per_weight();
  auto defined = [](const Result<uint32_t>& id, uint32_t expected,
                    const std::string& what) -> Status {
    if (!id.ok()) return InvalidArgument("restore: " + id.status().message());
    if (*id != expected) {
      return InvalidArgument(
          "restore: " + what + " has id " + std::to_string(expected) +
          " in the snapshot, but its name maps to " + std::to_string(*id));
    }
    return Status::Ok();
  };

  for (const TensorSnapshot& ts : tensors) {
    const std::string what = "tensor '" + ts.name + "'";
    if (fresh.tensors_.count(ts.id) > 0) {
      return InvalidArgument("restore: " + what + " appears twice");
    }
    TETHER_RETURN_IF_ERROR(
        defined(fresh.DefineTensor(ts.name, ts.shape, ts.init), ts.id, what));
    Tensor& t = *fresh.tensors_.at(ts.id);
    for (const TensorSnapshot::Block& sb : ts.blocks) {
      const std::string block =
          "restore: " + what + ": block " + std::to_string(sb.index);
      if (sb.index >= t.num_blocks) {
        return InvalidArgument(block + " is past the end (" +
                               std::to_string(t.num_blocks) + " blocks)");
      }
      const uint32_t len = t.BlockLen(sb.index, block_size_);
      if (sb.Weights().size() != len) {
        return InvalidArgument(block + " has " +
                               std::to_string(sb.Weights().size()) +
                               " weights, expected " + std::to_string(len));
      }
      if (sb.Slots().size() != slots_per_weight * len) {
        return SlotMismatch(block, sb.Slots().size(), slots_per_weight * len,
                            optimizer_.options().kind);
      }
      auto [it, inserted] = t.blocks.try_emplace(sb.index);
      if (!inserted) return InvalidArgument(block + " appears twice");
      Block& b = it->second;
      b.len = len;
      b.step = sb.step;
      b.slots_len = sb.Slots().size();
      if (sb.shared && sb.shared_weights.data() == sb.shared->weights.get() &&
          sb.shared_slots.data() == sb.shared->slots.get()) {
        // Buffers nobody writes into while shared (a round read from disk,
        // another store's snapshot): taken as they are; the first update of
        // the block writes new ones, as for a block a reply still shares.
        b.weights_owner = sb.shared->weights;
        b.slots_owner = sb.shared->slots;
      } else {
        b.weights_owner.reset(new float[len]);
        std::memcpy(b.weights_owner.get(), sb.Weights().data(),
                    size_t{len} * sizeof(float));
        b.slots_owner.reset(new float[b.slots_len]);
        std::memcpy(b.slots_owner.get(), sb.Slots().data(),
                    b.slots_len * sizeof(float));
      }
      t.floats_held += size_t{len} * (1 + slots_per_weight);
    }
  }

  for (const TableSnapshot& ts : tables) {
    const std::string what = "table '" + ts.name + "'";
    if (fresh.tables_.count(ts.id) > 0) {
      return InvalidArgument("restore: " + what + " appears twice");
    }
    TETHER_RETURN_IF_ERROR(
        defined(fresh.DefineTable(ts.name, ts.dim, ts.init), ts.id, what));
    Table& t = *fresh.tables_.at(ts.id);
    for (const TableSnapshot::Row& sr : ts.rows) {
      const std::string row =
          "restore: " + what + ": row " + std::to_string(sr.key);
      if (sr.weights.size() != t.dim) {
        return InvalidArgument(row + " has " +
                               std::to_string(sr.weights.size()) +
                               " weights, expected " + std::to_string(t.dim));
      }
      if (sr.slots.size() != t.stride - t.dim) {
        return SlotMismatch(row, sr.slots.size(), t.stride - t.dim,
                            optimizer_.options().kind);
      }
      const uint64_t r = t.rows();
      if (!t.row_of_key.emplace(sr.key, r).second) {
        return InvalidArgument(row + " appears twice");
      }
      float* dst = t.Append(r, sr.step);
      std::memcpy(dst, sr.weights.data(), t.dim * sizeof(float));
      if (!sr.slots.empty()) {
        std::memcpy(dst + t.dim, sr.slots.data(),
                    sr.slots.size() * sizeof(float));
      }
    }
  }

  tensors_.swap(fresh.tensors_);
  tables_.swap(fresh.tables_);
  return Status::Ok();
}

ParamStore::Counts ParamStore::counts() const {
  Counts c;
  c.tensors = static_cast<uint32_t>(tensors_.size() + tables_.size());
  uint64_t floats = 0;
  for (const auto& [id, t] : tensors_) {
    c.dense_blocks += t->blocks.size();
    floats += t->floats_held;
  }
  for (const auto& [id, t] : tables_) {
    c.sparse_rows += t->rows();
    floats += t->rows() * t->stride;
  }
  c.bytes = floats * sizeof(float);
  return c;
}

}  // namespace tether
