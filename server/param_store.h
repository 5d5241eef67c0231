// A shard's parameters: dense tensors cut into fixed-size blocks, and sparse
// tables of rows keyed by u64. Blocks and rows are created on first touch
// (pull or push) with their initial values, so which shard holds what is
// decided by the client's slicer alone. Each block and row carries its
// optimizer slots and update count.
//
// A tensor or table with init kProvided has no initial values of its own: a
// worker provides them (ProvideBlock, ProvideRows; the first provider wins),
// and until then reading or updating a block or row is kNotReady.
//
// Not thread-safe: the owning Shard serializes access.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "schema/status.h"
#include "server/apply_pool.h"
#include "server/checkpoint.h"
#include "server/initializer.h"
#include "server/optimizer.h"

namespace tether {

// The id a tensor or table name maps to (32-bit FNV-1a): stable across
// processes and runs, used on the wire and to seed initial values.
uint32_t NameId(const std::string& name);

// "[3, 4]", and "uniform(0.1)" and the like, for messages and tools.
std::string ShapeString(const std::vector<uint64_t>& shape);
std::string InitString(const InitSpec& init);

class ParamStore {
 public:
  ParamStore(uint64_t seed, uint32_t block_size, OptimizerOptions optimizer);
  ~ParamStore();

  // Defines a dense tensor. Idempotent when name, shape and init match.
  // Returns its id; kShapeMismatch (naming the tensor and both shapes or
  // inits) if it exists differently, or exists as a table (tensors and
  // tables share one id space); kInvalidArgument for an empty name, an
  // empty shape or a zero dimension, a bad init (unknown kind, non-finite
  // scale, negative uniform or normal scale), or an id collision with
  // another name.
  // With `require_same_init` false (observers reading a model) an existing
  // tensor of the same shape is accepted whatever its init.
  Result<uint32_t> DefineTensor(const std::string& name,
                                const std::vector<uint64_t>& shape,
                                const InitSpec& init,
                                bool require_same_init = true);
  // Defines a sparse table of rows of `dim` floats; same rules.
  Result<uint32_t> DefineTable(const std::string& name, uint32_t dim,
                               const InitSpec& init,
                               bool require_same_init = true);

  // Weights of dense block `block` of `tensor`, created on first touch. The
  // span stays valid until the next call that creates or applies.
  // kNotFound for an unknown tensor, kInvalidArgument for a block index past
  // the end. Blocks hold block_size() floats except the last.
  Result<std::span<const float>> ReadBlock(uint32_t tensor, uint32_t block);
  // The weights of a block as a read-only snapshot: `values` stays valid
  // and unchanged for as long as `owner` is held, because a later push
  // copies the block before writing (copy on write). Lets a shard send
  // weights without copying them. Same errors as ReadBlock.
  struct SharedBlock {
    std::shared_ptr<const void> owner;
    std::span<const float> values;
  };
  Result<SharedBlock> ShareBlock(uint32_t tensor, uint32_t block);

  // Applies `grad` (exactly the block's length, else kInvalidArgument) with
  // the optimizer at rate lr * lr_scale. kNonFinite, leaving the block
  // unchanged, when the update would make a weight or slot NaN or Inf.
  Status ApplyBlock(uint32_t tensor, uint32_t block,
                    std::span<const float> grad, float lr_scale = 1.0f);
  // Several blocks of one tensor, as ApplyBlock on each in turn (a block
  // given twice is applied twice, in order). Returns the first error; the
  // other blocks still apply. With a `pool` of several threads and at
  // least kParallelApplyFloats floats in all, the optimizer's arithmetic
  // runs on the pool's threads, each taking a run of whole blocks; the
  // result is the same to the bit either way.
  // `bound`, when finite, is at least every |grad| value (the push's
  // check measured it: MaxMagnitude), which spares the optimizer a scan.
  struct BlockGrad {
    uint32_t block;
    std::span<const float> grad;
    float bound = std::numeric_limits<float>::infinity();
  };
  static constexpr size_t kParallelApplyFloats = size_t{1} << 19;
  Status ApplyBlocks(uint32_t tensor, std::span<const BlockGrad> grads,
                     float lr_scale = 1.0f, ApplyPool* pool = nullptr);

  // Copies the rows of `keys` into `out` (keys.size() * dim floats, row
  // after row), creating missing rows. kNotFound for an unknown table,
  // kInvalidArgument for a wrong `out` size.
  Status ReadRows(uint32_t table, std::span<const uint64_t> keys,
                  std::span<float> out);
  // Applies one gradient row per key (keys.size() * dim floats). A key
  // repeated in `keys` is applied once per occurrence. A row whose update
  // would turn a weight or slot NaN or Inf is left unchanged (the others
  // are applied), and the result is kNonFinite naming how many.
  Status ApplyRows(uint32_t table, std::span<const uint64_t> keys,
                   std::span<const float> grads, float lr_scale = 1.0f);

  // Writes the initial values of block `block` of a provided tensor, unless
  // the block already has values (then nothing changes). kInvalidArgument if
  // the tensor's init is not kProvided or `values` is not the block's
  // length; errors as for ReadBlock otherwise.
  Status ProvideBlock(uint32_t tensor, uint32_t block,
                      std::span<const float> values);
  // Replaces the values of block `block` of `tensor` with `values` (the
  // block's length, else kInvalidArgument), whatever its init and whether
  // it had values: not a gradient, so the optimizer slots and update count
  // stay as they are. A block a frame or snapshot shares is copied first.
  Status AssignBlock(uint32_t tensor, uint32_t block,
                     std::span<const float> values);
  // The same for rows of a provided table (keys.size() * dim floats).
  Status ProvideRows(uint32_t table, std::span<const uint64_t> keys,
                     std::span<const float> values);
  // kNotReady if a block of `blocks` (tensor `id`) or a row of `keys` (table
  // `id`) of a provided tensor or table has no values yet; OK otherwise
  // (unknown ids included: other checks name those).
  Status Ready(uint32_t id, std::span<const uint32_t> blocks,
               std::span<const uint64_t> keys) const;

  // The name of tensor or table `id`, or "id N" when there is none.
  std::string NameOf(uint32_t id) const;

  // Row width of `table`, or kNotFound.
  Result<uint32_t> TableDim(uint32_t table) const;
  // Number of floats in `tensor`, or kNotFound.
  Result<uint64_t> TensorSize(uint32_t tensor) const;

  // Copies every tensor and table this store holds (weights, slots and
  // update counts of each touched block and row) into `tensors` and
  // `tables`, the data part of a ShardSnapshot. Costs one copy of the
  // store: the pause a checkpoint causes, since callers hold the lock.
  void Snapshot(std::vector<TensorSnapshot>* tensors,
                std::vector<TableSnapshot>* tables) const;
  // Replaces the store's contents with a snapshot's (definitions included).
  // kInvalidArgument naming the tensor when a block or row does not fit
  // (wrong length, slot count for this optimizer, index past the end); the
  // store is unchanged then.
  Status Restore(const std::vector<TensorSnapshot>& tensors,
                 const std::vector<TableSnapshot>& tables);

  struct Counts {
    uint32_t tensors = 0;  // dense tensors plus sparse tables defined
    uint64_t dense_blocks = 0;
    uint64_t sparse_rows = 0;
    uint64_t bytes = 0;  // weights plus optimizer slots held
  };
  Counts counts() const;

  uint32_t block_size() const { return block_size_; }
  uint64_t seed() const { return seed_; }
  const Optimizer& optimizer() const { return optimizer_; }

 private:
  struct Block;
  struct Tensor;
  struct Table;

  // OK if no tensor or table holds `id`; kInvalidArgument if another name
  // does, kShapeMismatch if `name` itself does as the other kind.
  Status CheckIdFree(const std::string& kind, const std::string& name,
                     uint32_t id) const;
  // The tensor, if it exists and has block `block`; errors as for
  // ReadBlock.
  Result<Tensor*> FindBlock(uint32_t tensor, uint32_t block);
  // The table, if it exists and `floats` == `keys` * dim; `buffer` names the
  // span checked in the error message.
  Result<Table*> FindTable(uint32_t table, size_t keys, size_t floats,
                           const char* buffer);

  // Buffers of `n` floats for ApplyBlock to write into: one per length, so
  // a steady run of updates allocates nothing.
  std::shared_ptr<float[]> TakeSpare(size_t n);
  void GiveSpare(std::shared_ptr<float[]> buffer, size_t n);

  const uint64_t seed_;
  const uint32_t block_size_;
  const Optimizer optimizer_;

  std::unordered_map<size_t, std::vector<std::shared_ptr<float[]>>> spares_;

  std::unordered_map<uint32_t, std::unique_ptr<Tensor>> tensors_;
  std::unordered_map<uint32_t, std::unique_ptr<Table>> tables_;
};

}  // namespace tether
