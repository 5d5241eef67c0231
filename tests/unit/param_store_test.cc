#include "server/param_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "server/apply_pool.h"
#include "server/initializer.h"
#include "server/optimizer.h"

namespace tether {
namespace {

constexpr uint64_t kSeed = 42;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

InitSpec Normal(float stddev) {
  return {.kind = InitSpec::Kind::kNormal, .scale = stddev};
}
InitSpec Uniform(float scale) {
  return {.kind = InitSpec::Kind::kUniform, .scale = scale};
}
InitSpec Constant(float value) {
  return {.kind = InitSpec::Kind::kConstant, .scale = value};
}

OptimizerOptions Opt(OptimizerKind kind, float lr = 0.01f) {
  OptimizerOptions o;
  o.kind = kind;
  o.lr = lr;
  return o;
}

// Every block of `tensor`, read in order and concatenated.
std::vector<float> ReadAll(ParamStore& store, uint32_t tensor) {
  const uint64_t numel = *store.TensorSize(tensor);
  const uint64_t blocks = (numel + store.block_size() - 1) / store.block_size();
  std::vector<float> all;
  for (uint32_t b = 0; b < blocks; ++b) {
    Result<std::span<const float>> block = store.ReadBlock(tensor, b);
    EXPECT_TRUE(block.ok()) << block.status().ToString();
    if (!block.ok()) return all;
    all.insert(all.end(), block->begin(), block->end());
  }
  return all;
}

// --- NameId -----------------------------------------------------------------

TEST(NameId, IsFnv1a32) {
  // The published FNV-1a 32-bit test vectors.
  EXPECT_EQ(NameId(""), 0x811c9dc5u);
  EXPECT_EQ(NameId("a"), 0xe40c292cu);
  EXPECT_EQ(NameId("foobar"), 0xbf9cf968u);
}

// --- ParamStore: dense ------------------------------------------------------

TEST(ParamStore, InitialValuesIndependentOfBlockSize) {
  ParamStore small(kSeed, 7, Opt(OptimizerKind::kSgd));
  ParamStore large(kSeed, 64, Opt(OptimizerKind::kSgd));
  const std::vector<uint64_t> shape = {10, 13};
  const uint32_t a = *small.DefineTensor("w", shape, Normal(0.1f));
  const uint32_t b = *large.DefineTensor("w", shape, Normal(0.1f));
  ASSERT_EQ(a, b);

  const std::vector<float> from_small = ReadAll(small, a);
  const std::vector<float> from_large = ReadAll(large, b);
  ASSERT_EQ(from_small.size(), 130u);
  EXPECT_EQ(from_small, from_large);
  EXPECT_NE(from_small[0], from_small[1]);
}

TEST(ParamStore, InitialValuesIndependentOfTouchOrder) {
  ParamStore forward(kSeed, 8, Opt(OptimizerKind::kSgd));
  ParamStore backward(kSeed, 8, Opt(OptimizerKind::kSgd));
  const uint32_t id = *forward.DefineTensor("w", {40}, Uniform(1.0f));
  ASSERT_TRUE(backward.DefineTensor("w", {40}, Uniform(1.0f)).ok());
  std::vector<std::vector<float>> f(5), b(5);
  for (uint32_t i = 0; i < 5; ++i) {
    auto block = *forward.ReadBlock(id, i);
    f[i].assign(block.begin(), block.end());
  }
  for (uint32_t i = 5; i-- > 0;) {
    auto block = *backward.ReadBlock(id, i);
    b[i].assign(block.begin(), block.end());
  }
  EXPECT_EQ(f, b);
}

TEST(ParamStore, BlockFirstTouchMatchesFillInitial) {
  ParamStore store(kSeed, 16, Opt(OptimizerKind::kSgd));
  const uint32_t id = *store.DefineTensor("w", {50}, Normal(1.0f));
  std::vector<float> expected(2);
  // Block 3 covers elements [48, 50): the short last block.
  FillInitial(Normal(1.0f), kSeed, id, 48, expected);
  Result<std::span<const float>> block = store.ReadBlock(id, 3);
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  EXPECT_EQ(std::vector<float>(block->begin(), block->end()), expected);
}

TEST(ParamStore, DefineIsIdempotentAndRejectsOtherShape) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  Result<uint32_t> first = store.DefineTensor("w", {3, 4}, Uniform(0.5f));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, NameId("w"));
  Result<uint32_t> again = store.DefineTensor("w", {3, 4}, Uniform(0.5f));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(store.counts().tensors, 1u);

  Result<uint32_t> other_shape = store.DefineTensor("w", {4, 3}, Uniform(0.5f));
  ASSERT_FALSE(other_shape.ok());
  EXPECT_EQ(other_shape.status().code(), Code::kShapeMismatch);
  EXPECT_PRED2(Contains, other_shape.status().message(), "'w'");
  EXPECT_PRED2(Contains, other_shape.status().message(), "[3, 4]");
  EXPECT_PRED2(Contains, other_shape.status().message(), "[4, 3]");

  Result<uint32_t> other_init = store.DefineTensor("w", {3, 4}, Normal(0.5f));
  ASSERT_FALSE(other_init.ok());
  EXPECT_EQ(other_init.status().code(), Code::kShapeMismatch);
  // A reader attaching by shape does not need to know the init.
  Result<uint32_t> attach = store.DefineTensor("w", {3, 4}, Normal(0.5f),
                                               /*require_same_init=*/false);
  ASSERT_TRUE(attach.ok());
  EXPECT_EQ(*attach, *first);
}

TEST(ParamStore, TableDefineIsIdempotentAndRejectsOtherDim) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  const uint32_t id = *store.DefineTable("emb", 8, Normal(0.1f));
  EXPECT_EQ(id, NameId("emb"));
  EXPECT_EQ(*store.DefineTable("emb", 8, Normal(0.1f)), id);
  Result<uint32_t> other = store.DefineTable("emb", 16, Normal(0.1f));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), Code::kShapeMismatch);
  EXPECT_PRED2(Contains, other.status().message(), "'emb'");
  EXPECT_EQ(*store.TableDim(id), 8u);
}

TEST(ParamStore, TensorAndTableCannotShareAName) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  ASSERT_TRUE(store.DefineTensor("x", {4}, Uniform(1.0f)).ok());
  Result<uint32_t> table = store.DefineTable("x", 4, Uniform(1.0f));
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), Code::kShapeMismatch);
}

TEST(ParamStore, DefineRejectsEmptyNameEmptyShapeZeroDimAndBadInit) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  EXPECT_EQ(store.DefineTensor("", {4}, {}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(store.DefineTensor("w", {}, {}).status().code(),
            Code::kInvalidArgument);
  Result<uint32_t> zero = store.DefineTensor("w", {3, 0}, {});
  EXPECT_EQ(zero.status().code(), Code::kInvalidArgument);
  EXPECT_PRED2(Contains, zero.status().message(), "[3, 0]");
  EXPECT_EQ(store.DefineTable("", 4, {}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(store.DefineTable("t", 0, {}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(
      store.DefineTensor("w", {4}, Uniform(std::nanf(""))).status().code(),
      Code::kInvalidArgument);
  EXPECT_EQ(store.DefineTable("t", 4, Normal(-1.0f)).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(store.DefineTensor("w", {UINT64_MAX, 2}, {}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(store.counts().tensors, 0u);
}

TEST(ParamStore, BlockPastEndIsInvalidArgument) {
  ParamStore store(kSeed, 7, Opt(OptimizerKind::kSgd));
  const uint32_t id = *store.DefineTensor("w", {70}, {});  // 10 blocks
  EXPECT_TRUE(store.ReadBlock(id, 9).ok());
  Result<std::span<const float>> past = store.ReadBlock(id, 10);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(past.status().message(),
            "tensor 'w': block 10 is past the end (10 blocks)");
  std::vector<float> grad(7, 1.0f);
  EXPECT_EQ(store.ApplyBlock(id, 10, grad).code(), Code::kInvalidArgument);
  EXPECT_EQ(store.counts().dense_blocks, 1u);
}

TEST(ParamStore, LastBlockIsShort) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  const uint32_t id = *store.DefineTensor("w", {65}, {});
  EXPECT_EQ(store.ReadBlock(id, 0)->size(), 64u);
  EXPECT_EQ(store.ReadBlock(id, 1)->size(), 1u);
  EXPECT_FALSE(store.ReadBlock(id, 2).ok());
}

TEST(ParamStore, UnknownTensorIsNotFound) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  Result<std::span<const float>> read = store.ReadBlock(1234, 0);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), Code::kNotFound);
  EXPECT_EQ(read.status().message(), "unknown tensor id 1234");
  std::vector<float> grad(1);
  EXPECT_EQ(store.ApplyBlock(1234, 0, grad).code(), Code::kNotFound);
  EXPECT_EQ(store.TensorSize(1234).status().code(), Code::kNotFound);
}

TEST(ParamStore, UnknownTableIsNotFound) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  std::vector<uint64_t> keys = {1};
  std::vector<float> rows(4);
  Status read = store.ReadRows(99, keys, rows);
  EXPECT_EQ(read.code(), Code::kNotFound);
  EXPECT_EQ(read.message(), "unknown table id 99");
  EXPECT_EQ(store.ApplyRows(99, keys, rows).code(), Code::kNotFound);
  EXPECT_EQ(store.TableDim(99).status().code(), Code::kNotFound);
}

TEST(ParamStore, ApplyBlockRejectsWrongGradientLength) {
  ParamStore store(kSeed, 8, Opt(OptimizerKind::kSgd));
  const uint32_t id = *store.DefineTensor("w", {10}, {});
  std::vector<float> grad(8);  // block 1 holds 2 floats
  Status s = store.ApplyBlock(id, 1, grad);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_PRED2(Contains, s.message(), "'w'");
  EXPECT_EQ(store.counts().dense_blocks,
            0u);  // a rejected push creates nothing
}

TEST(ParamStore, SgdPushesSumExactly) {
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kSgd, 1.0f));
  const uint32_t id = *store.DefineTensor("w", {6}, {});  // zeros
  // Small integers and lr = 1: every intermediate is exact in float.
  const std::vector<std::vector<float>> pushes = {
      {1, 2, 3, 4}, {-5, 6, 0, 7}, {100, -100, 3, 1}};
  for (const auto& g : pushes) ASSERT_TRUE(store.ApplyBlock(id, 0, g).ok());
  ASSERT_TRUE(store.ApplyBlock(id, 1, std::vector<float>{9, -9}).ok());
  const std::vector<float> expected = {-96, 92, -6, -12, -9, 9};
  EXPECT_EQ(ReadAll(store, id), expected);
}

TEST(ParamStore, StepCountIsPerBlock) {
  // Adam's bias correction depends on the step, so block 1's first update
  // must be a first step even after block 0 has had two.
  const OptimizerOptions options = Opt(OptimizerKind::kAdam, 0.1f);
  ParamStore store(kSeed, 2, options);
  const uint32_t id = *store.DefineTensor("w", {4}, {});
  const std::vector<float> g = {1.0f, -0.5f};
  ASSERT_TRUE(store.ApplyBlock(id, 0, g).ok());
  ASSERT_TRUE(store.ApplyBlock(id, 0, g).ok());
  ASSERT_TRUE(store.ApplyBlock(id, 1, g).ok());

  const Optimizer opt(options);
  std::vector<float> w0(2, 0.0f), s0(4, 0.0f), w1(2, 0.0f), s1(4, 0.0f);
  opt.Apply(w0, s0, g, 1);
  opt.Apply(w0, s0, g, 2);
  opt.Apply(w1, s1, g, 1);
  EXPECT_EQ(std::vector<float>(store.ReadBlock(id, 0)->begin(),
                               store.ReadBlock(id, 0)->end()),
            w0);
  EXPECT_EQ(std::vector<float>(store.ReadBlock(id, 1)->begin(),
                               store.ReadBlock(id, 1)->end()),
            w1);
}

TEST(ParamStore, CountsBytesIncludeSlots) {
  // Momentum keeps one slot per weight: 8 bytes per float held.
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kMomentum));
  const uint32_t w = *store.DefineTensor("w", {10}, {});
  const uint32_t t = *store.DefineTable("t", 3, {});
  ASSERT_TRUE(store.ReadBlock(w, 0).ok());  // 4 floats
  ASSERT_TRUE(store.ReadBlock(w, 2).ok());  // 2 floats
  std::vector<uint64_t> keys = {7};
  std::vector<float> row(3);
  ASSERT_TRUE(store.ReadRows(t, keys, row).ok());  // 3 floats
  const ParamStore::Counts c = store.counts();
  EXPECT_EQ(c.tensors, 2u);
  EXPECT_EQ(c.dense_blocks, 2u);
  EXPECT_EQ(c.sparse_rows, 1u);
  EXPECT_EQ(c.bytes, (4u + 2u + 3u) * 2u * 4u);
}

// --- ParamStore: sparse -----------------------------------------------------

TEST(ParamStore, SparseRowsCreatedOnFirstTouch) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kAdam));
  const uint32_t id = *store.DefineTable("emb", 4, Normal(0.1f));
  EXPECT_EQ(store.counts().sparse_rows, 0u);

  std::vector<uint64_t> keys = {5, 9};
  std::vector<float> out(8);
  ASSERT_TRUE(store.ReadRows(id, keys, out).ok());
  EXPECT_EQ(store.counts().sparse_rows, 2u);

  std::vector<uint64_t> push_keys = {9, 11};
  std::vector<float> grads(8, 0.5f);
  ASSERT_TRUE(store.ApplyRows(id, push_keys, grads).ok());
  EXPECT_EQ(store.counts().sparse_rows, 3u);

  ASSERT_TRUE(store.ReadRows(id, keys, out).ok());
  EXPECT_EQ(store.counts().sparse_rows, 3u);
  // Adam: weights plus two slots, 4 bytes each.
  EXPECT_EQ(store.counts().bytes, 3u * 4u * 3u * 4u);
}

TEST(ParamStore, SparseRowsSurviveManyChunks) {
  // Enough rows of a wide table to span several storage chunks; each row
  // must still read back its own initial value.
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  const InitSpec init = Uniform(1.0f);
  const uint32_t dim = 1000;
  const uint32_t id = *store.DefineTable("wide", dim, init);
  std::vector<uint64_t> keys(300);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919;
  std::vector<float> out(keys.size() * dim);
  ASSERT_TRUE(store.ReadRows(id, keys, out).ok());
  std::vector<float> again(out.size());
  ASSERT_TRUE(store.ReadRows(id, keys, again).ok());
  EXPECT_EQ(out, again);
  std::vector<float> expected(dim);
  FillInitial(init, kSeed, id, keys[299] * dim, expected);
  EXPECT_EQ(std::vector<float>(out.end() - dim, out.end()), expected);
}

TEST(ParamStore, SparseRowInitDependsOnlyOnKey) {
  const InitSpec init = Normal(0.5f);
  ParamStore a(kSeed, 64, Opt(OptimizerKind::kSgd));
  ParamStore b(kSeed, 1024, Opt(OptimizerKind::kAdam));
  const uint32_t id = *a.DefineTable("emb", 4, init);
  ASSERT_TRUE(b.DefineTable("emb", 4, init).ok());

  // Different neighbours and touch order in each store.
  std::vector<float> scratch(12);
  ASSERT_TRUE(a.ReadRows(id, std::vector<uint64_t>{1, 2, 3}, scratch).ok());
  std::vector<float> from_a(4), from_b(4);
  ASSERT_TRUE(a.ReadRows(id, std::vector<uint64_t>{42}, from_a).ok());
  ASSERT_TRUE(b.ReadRows(id, std::vector<uint64_t>{42}, from_b).ok());
  EXPECT_EQ(from_a, from_b);

  std::vector<float> expected(4);
  FillInitial(init, kSeed, id, 42 * 4, expected);
  EXPECT_EQ(from_a, expected);

  // Keys near 2^64 wrap instead of failing.
  const uint64_t big = std::numeric_limits<uint64_t>::max();
  ASSERT_TRUE(a.ReadRows(id, std::vector<uint64_t>{big}, from_a).ok());
  FillInitial(init, kSeed, id, big * 4, expected);
  EXPECT_EQ(from_a, expected);
}

TEST(ParamStore, RepeatedKeyIsAppliedPerOccurrence) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd, 1.0f));
  const uint32_t id = *store.DefineTable("t", 2, {});
  const std::vector<uint64_t> keys = {3, 3, 4};
  const std::vector<float> grads = {1, 10, 2, 20, 5, 5};
  ASSERT_TRUE(store.ApplyRows(id, keys, grads).ok());
  std::vector<float> out(4);
  ASSERT_TRUE(store.ReadRows(id, std::vector<uint64_t>{3, 4}, out).ok());
  EXPECT_EQ(out, (std::vector<float>{-3, -30, -5, -5}));
  EXPECT_EQ(store.counts().sparse_rows, 2u);
}

TEST(ParamStore, RowBufferOfWrongSizeIsInvalidArgument) {
  ParamStore store(kSeed, 64, Opt(OptimizerKind::kSgd));
  const uint32_t id = *store.DefineTable("t", 4, {});
  const std::vector<uint64_t> keys = {1, 2};
  std::vector<float> short_buffer(7);
  Status read = store.ReadRows(id, keys, short_buffer);
  EXPECT_EQ(read.code(), Code::kInvalidArgument);
  EXPECT_PRED2(Contains, read.message(), "'t'");
  EXPECT_EQ(store.ApplyRows(id, keys, short_buffer).code(),
            Code::kInvalidArgument);
  // A rejected call creates nothing.
  EXPECT_EQ(store.counts().sparse_rows, 0u);
}

// --- Initializer ------------------------------------------------------------

TEST(Initializer, UniformWithinScaleWithMeanNearZero) {
  const InitSpec init = Uniform(0.5f);
  std::vector<float> v(100000);
  FillInitial(init, kSeed, 7, 0, v);
  double sum = 0;
  float lo = 1, hi = -1;
  for (float x : v) {
    ASSERT_GE(x, -0.5f);
    ASSERT_LT(x, 0.5f);
    sum += x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  // Standard error of the mean: 0.5 / sqrt(3) / sqrt(1e5) ~= 0.0009.
  EXPECT_NEAR(sum / v.size(), 0.0, 0.005);
  EXPECT_LT(lo, -0.49f);
  EXPECT_GT(hi, 0.49f);
}

TEST(Initializer, NormalStddevWithinTwoPercent) {
  const float stddev = 0.1f;
  std::vector<float> v(100000);
  FillInitial(Normal(stddev), kSeed, 7, 1000, v);
  double sum = 0, sum_sq = 0;
  for (float x : v) {
    sum += x;
    sum_sq += double{x} * x;
  }
  const double mean = sum / v.size();
  const double sd = std::sqrt(sum_sq / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, stddev, 0.02 * stddev);
}

TEST(Initializer, DifferentSeedsAndIdsGiveDifferentValues) {
  const InitSpec init = Uniform(1.0f);
  std::vector<float> base(1000), other_seed(1000), other_id(1000);
  FillInitial(init, 1, 7, 0, base);
  FillInitial(init, 2, 7, 0, other_seed);
  FillInitial(init, 1, 8, 0, other_id);
  int same_seed = 0, same_id = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    same_seed += base[i] == other_seed[i];
    same_id += base[i] == other_id[i];
  }
  // 24-bit values: a chance match is ~1 in 16 million.
  EXPECT_LE(same_seed, 1);
  EXPECT_LE(same_id, 1);
}

TEST(Initializer, IsPureFunction) {
  for (const InitSpec& init : {Uniform(0.3f), Normal(2.0f)}) {
    std::vector<float> first(500), second(500);
    FillInitial(init, kSeed, 3, 123456789, first);
    FillInitial(init, kSeed, 3, 123456789, second);
    EXPECT_EQ(first, second);
    for (size_t k = 0; k < first.size(); ++k) {
      ASSERT_EQ(first[k], InitialValue(init, kSeed, 3, 123456789 + k));
      ASSERT_EQ(InitialValue(init, kSeed, 3, 123456789 + k),
                InitialValue(init, kSeed, 3, 123456789 + k));
    }
  }
}

TEST(Initializer, ConstantGivesTheConstantAndZerosGivesZero) {
  std::vector<float> v(10, -1.0f);
  FillInitial(Constant(0.25f), kSeed, 1, 5, v);
  for (float x : v) EXPECT_EQ(x, 0.25f);
  EXPECT_EQ(InitialValue(Constant(-3.0f), kSeed, 1, 99), -3.0f);
  FillInitial(InitSpec{}, kSeed, 1, 5, v);
  for (float x : v) EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace tether

namespace tether {
namespace {

TEST(ParamStoreSharing, SharedBlockUnchangedByLaterPush) {
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = 1.0f;
  ParamStore store(7, 4, sgd);
  auto id = store.DefineTensor("w", {6}, {});
  ASSERT_TRUE(id.ok());
  auto shared = store.ShareBlock(*id, 0);
  ASSERT_TRUE(shared.ok());
  ASSERT_EQ(shared->values.size(), 4u);
  std::vector<float> grad = {-1, -2, -3, -4};
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());
  // The snapshot a frame is still sending keeps the old values...
  for (float v : shared->values) EXPECT_EQ(v, 0.0f);
  // ...while the store moved on.
  auto now = store.ReadBlock(*id, 0);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(std::vector<float>(now->begin(), now->end()),
            (std::vector<float>{1, 2, 3, 4}));
  // Once released, the block is updated in place again.
  shared->owner.reset();
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());
  now = store.ReadBlock(*id, 0);
  EXPECT_EQ((*now)[3], 8.0f);
}

}  // namespace
// --- Non-finite updates
// -------------------------------------------------------

TEST(ParamStore, OverflowingUpdateIsRefusedAndTheBlockStaysAsItWas) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdaGrad, OptimizerKind::kAdam}) {
    SCOPED_TRACE(OptimizerName(kind));
    ParamStore store(7, 4, Opt(kind, 10.0f));
    auto id = store.DefineTensor("w", {6}, Uniform(0.5f));
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(store.ApplyBlock(*id, 0, std::vector<float>(4, 0.1f)).ok());
    const std::vector<float> before = ReadAll(store, *id);
    // Finite, but its square (AdaGrad, Adam) or lr times it overflows.
    Status s = store.ApplyBlock(*id, 0, std::vector<float>(4, 3e38f));
    EXPECT_EQ(s.code(), Code::kNonFinite) << s.ToString();
    EXPECT_NE(s.message().find("tensor 'w' block 0"), std::string::npos)
        << s.message();
    const std::vector<float> after = ReadAll(store, *id);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), 6 * sizeof(float)), 0);
    // The block still trains, its update count untouched by the refusal:
    // a second ordinary step matches a store that never saw it.
    ParamStore twin(7, 4, Opt(kind, 10.0f));
    ASSERT_TRUE(twin.DefineTensor("w", {6}, Uniform(0.5f)).ok());
    for (ParamStore* p : {&store, &twin}) {
      if (p == &twin) {
        ASSERT_TRUE(p->ApplyBlock(*id, 0, std::vector<float>(4, 0.1f)).ok());
      }
      ASSERT_TRUE(p->ApplyBlock(*id, 0, std::vector<float>(4, 0.2f)).ok());
    }
    const std::vector<float> a = ReadAll(store, *id), b = ReadAll(twin, *id);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), 6 * sizeof(float)), 0);
  }
}

TEST(ParamStore, OverflowingRowIsRefusedOthersApply) {
  ParamStore store(7, 4, Opt(OptimizerKind::kAdam, 10.0f));
  auto id = store.DefineTable("t", 2, Constant(1.0f));
  ASSERT_TRUE(id.ok());
  const std::vector<uint64_t> keys = {5, 9};
  const std::vector<float> grads = {0.5f, 0.5f, 3e38f, 3e38f};
  Status s = store.ApplyRows(*id, keys, grads);
  EXPECT_EQ(s.code(), Code::kNonFinite) << s.ToString();
  EXPECT_NE(s.message().find("1 row(s) (first: key 9)"), std::string::npos)
      << s.message();
  std::vector<float> rows(4);
  ASSERT_TRUE(store.ReadRows(*id, keys, rows).ok());
  EXPECT_NE(rows[0], 1.0f);  // key 5 applied
  EXPECT_EQ(rows[2], 1.0f);  // key 9 as it was
  EXPECT_EQ(rows[3], 1.0f);
}

TEST(ParamStore, UpdateLeavesASharedBlockAsItWasShared) {
  ParamStore store(7, 4, Opt(OptimizerKind::kAdam));
  auto id = store.DefineTensor("w", {4}, Uniform(0.5f));
  ASSERT_TRUE(id.ok());
  auto shared = store.ShareBlock(*id, 0);
  ASSERT_TRUE(shared.ok());
  const std::vector<float> seen(shared->values.begin(), shared->values.end());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(store.ApplyBlock(*id, 0, std::vector<float>(4, 1.0f)).ok());
  }
  EXPECT_TRUE(std::equal(seen.begin(), seen.end(), shared->values.begin()));
  EXPECT_NE(ReadAll(store, *id), seen);
}

// A block no frame or snapshot shares is updated in its own buffers (no
// copy into others); one that is shared gets new buffers, and the values
// are the same either way.
TEST(ParamStore, AnUnsharedBlockIsUpdatedInPlaceASharedOneIntoNewBuffers) {
  ParamStore store(7, 4, Opt(OptimizerKind::kAdam));
  ParamStore twin(7, 4, Opt(OptimizerKind::kAdam));
  auto id = store.DefineTensor("w", {4}, Uniform(0.5f));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(twin.DefineTensor("w", {4}, Uniform(0.5f)).ok());
  const std::vector<float> grad = {0.1f, -0.2f, 0.3f, -0.4f};
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());
  const float* buffer = nullptr;
  {
    auto shared = store.ShareBlock(*id, 0);
    ASSERT_TRUE(shared.ok());
    buffer = shared->values.data();
  }
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());  // unshared: in place
  auto shared = store.ShareBlock(*id, 0);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->values.data(), buffer);
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());  // shared: elsewhere
  auto after = store.ShareBlock(*id, 0);
  ASSERT_TRUE(after.ok());
  EXPECT_NE(after->values.data(), buffer);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(twin.ApplyBlock(*id, 0, grad).ok());
  const std::vector<float> a = ReadAll(store, *id), b = ReadAll(twin, *id);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 4 * sizeof(float)), 0);
}

// A push's check measures each block's gradient (MaxMagnitude) and passes
// the bound on; the optimizer then skips its own scan, with the same
// result, and an overflowing update is still refused.
TEST(ParamStore, BlocksGivenWithTheirGradientBoundsUpdateAsWithout) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdaGrad, OptimizerKind::kAdam}) {
    SCOPED_TRACE(OptimizerName(kind));
    ParamStore bounded(7, 3, Opt(kind)), plain(7, 3, Opt(kind));
    auto id = bounded.DefineTensor("w", {8}, Uniform(0.5f));
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(plain.DefineTensor("w", {8}, Uniform(0.5f)).ok());
    for (int step = 0; step < 4; ++step) {
      const std::vector<float> g0 = {0.1f * step, -0.2f, 0.3f},
                               g1 = {-0.4f, 0.5f, 0.6f}, g2 = {0.7f, -0.8f};
      const std::vector<ParamStore::BlockGrad> with = {
          {0, g0, MaxMagnitude(g0)},
          {1, g1, MaxMagnitude(g1)},
          {2, g2, MaxMagnitude(g2)}};
      const std::vector<ParamStore::BlockGrad> without = {
          {0, g0}, {1, g1}, {2, g2}};
      ASSERT_TRUE(bounded.ApplyBlocks(*id, with).ok());
      ASSERT_TRUE(plain.ApplyBlocks(*id, without).ok());
    }
    const std::vector<float> a = ReadAll(bounded, *id), b = ReadAll(plain, *id);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), 8 * sizeof(float)), 0);
    // At lr 10 a gradient of 3e38 overflows every rule's result.
    ParamStore hot(7, 3, Opt(kind, 10.0f));
    auto hot_id = hot.DefineTensor("w", {8}, Uniform(0.5f));
    ASSERT_TRUE(hot_id.ok());
    const std::vector<float> before = ReadAll(hot, *hot_id);
    const std::vector<float> huge = {3e38f, 3e38f, 3e38f};
    const std::vector<ParamStore::BlockGrad> over = {
        {0, huge, MaxMagnitude(huge)}};
    EXPECT_EQ(hot.ApplyBlocks(*hot_id, over).code(), Code::kNonFinite);
    EXPECT_EQ(ReadAll(hot, *hot_id), before);
  }
}

}  // namespace tether

// --- ParamStore: provided values --------------------------------------------

namespace tether {
namespace {

constexpr InitSpec kProvided{.kind = InitSpec::Kind::kProvided};

TEST(ParamStore, ProvidedTensorIsNotReadyUntilProvidedAndTheFirstProviderWins) {
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kSgd, 0.5f));
  auto id = store.DefineTensor("w", {6}, kProvided);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  // Before its provider: neither read nor updated, and nothing is created.
  Result<std::span<const float>> early = store.ReadBlock(*id, 0);
  ASSERT_EQ(early.status().code(), Code::kNotReady);
  EXPECT_TRUE(Contains(early.status().message(), "tensor 'w' block 0"))
      << early.status().message();
  const std::vector<float> grad = {1, 1, 1, 1};
  EXPECT_EQ(store.ApplyBlock(*id, 0, grad).code(), Code::kNotReady);
  EXPECT_EQ(store.Ready(*id, std::vector<uint32_t>{0, 1}, {}).code(),
            Code::kNotReady);
  EXPECT_EQ(store.counts().dense_blocks, 0u);

  const std::vector<float> first = {1, 2, 3, 4}, second = {9, 9, 9, 9};
  ASSERT_TRUE(store.ProvideBlock(*id, 0, first).ok());
  EXPECT_EQ(store.Ready(*id, std::vector<uint32_t>{0, 1}, {}).code(),
            Code::kNotReady);  // block 1 still missing
  ASSERT_TRUE(store.ProvideBlock(*id, 1, std::vector<float>{5, 6}).ok());
  EXPECT_TRUE(store.Ready(*id, std::vector<uint32_t>{0, 1}, {}).ok());
  // A second provider (another worker, or one restarted) changes nothing.
  ASSERT_TRUE(store.ProvideBlock(*id, 0, second).ok());
  EXPECT_EQ(ReadAll(store, *id), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // Then it trains like any tensor.
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());
  EXPECT_EQ(ReadAll(store, *id),
            (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 5, 6}));
}

// Assigned values replace a block's, provided or not, leaving the optimizer
// slots and update count (the next update's step is as without the
// assign), and never write into a block a frame or snapshot shares.
TEST(ParamStore, AssignReplacesValuesAndKeepsTheOptimizerState) {
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kAdam));
  ParamStore twin(kSeed, 4, Opt(OptimizerKind::kAdam));
  auto id = store.DefineTensor("w", {6}, Uniform(0.5f));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(twin.DefineTensor("w", {6}, Uniform(0.5f)).ok());
  const std::vector<float> grad = {0.1f, -0.2f, 0.3f, -0.4f};
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());
  ASSERT_TRUE(twin.ApplyBlock(*id, 0, grad).ok());
  auto shared = store.ShareBlock(*id, 0);
  ASSERT_TRUE(shared.ok());
  const std::vector<float> seen(shared->values.begin(), shared->values.end());

  const std::vector<float> assigned = {1, 2, 3, 4};
  ASSERT_TRUE(store.AssignBlock(*id, 0, assigned).ok());
  const std::vector<float> all = ReadAll(store, *id);
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + 4), assigned);
  const std::vector<float> before = ReadAll(twin, *id);
  EXPECT_EQ(std::vector<float>(all.begin() + 4, all.end()),
            std::vector<float>(before.begin() + 4, before.end()));
  EXPECT_TRUE(std::equal(seen.begin(), seen.end(), shared->values.begin()));

  // Adam's second step moves both stores' weights alike.
  ASSERT_TRUE(store.ApplyBlock(*id, 0, grad).ok());
  ASSERT_TRUE(twin.ApplyBlock(*id, 0, grad).ok());
  const std::vector<float> moved = ReadAll(store, *id),
                           twin_moved = ReadAll(twin, *id);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(moved[i] - assigned[i], twin_moved[i] - before[i], 1e-6f) << i;
  }

  Status wrong = store.AssignBlock(*id, 1, assigned);  // block 1 holds 2
  EXPECT_EQ(wrong.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(wrong.message(), "the values assigned 4"))
      << wrong.message();

  // A provided tensor's block: assigned values make it ready, and a later
  // provider changes nothing.
  auto provided = store.DefineTensor("p", {4}, kProvided);
  ASSERT_TRUE(provided.ok());
  ASSERT_TRUE(store.AssignBlock(*provided, 0, assigned).ok());
  EXPECT_TRUE(store.Ready(*provided, std::vector<uint32_t>{0}, {}).ok());
  ASSERT_TRUE(store.ProvideBlock(*provided, 0, grad).ok());
  EXPECT_EQ(ReadAll(store, *provided), assigned);
}

TEST(ParamStore, ProvideIsRefusedForOtherInitsAndWrongLengths) {
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kSgd));
  auto zeros = store.DefineTensor("z", {4}, InitSpec{});
  ASSERT_TRUE(zeros.ok());
  Status s = store.ProvideBlock(*zeros, 0, std::vector<float>{1, 2, 3, 4});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "not 'provided'")) << s.message();
  EXPECT_EQ(ReadAll(store, *zeros), (std::vector<float>{0, 0, 0, 0}));

  auto provided = store.DefineTensor("p", {4}, kProvided);
  ASSERT_TRUE(provided.ok());
  EXPECT_EQ(store.ProvideBlock(*provided, 0, std::vector<float>{1, 2}).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(store.ProvideBlock(*provided, 1, std::vector<float>{1}).code(),
            Code::kInvalidArgument);  // past the end
  EXPECT_EQ(store.ReadBlock(*provided, 0).status().code(), Code::kNotReady);
  // A provided tensor is not the same definition as a zeros one.
  EXPECT_EQ(store.DefineTensor("p", {4}, InitSpec{}).status().code(),
            Code::kShapeMismatch);
  EXPECT_TRUE(store.DefineTensor("p", {4}, kProvided).ok());
}

TEST(ParamStore, ProvidedTableRowsAreReadyOnlyOnceProvided) {
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kSgd, 1.0f));
  auto id = store.DefineTable("emb", 2, kProvided);
  ASSERT_TRUE(id.ok());
  const std::vector<uint64_t> keys = {3, 7};
  std::vector<float> out(4);
  EXPECT_EQ(store.ReadRows(*id, keys, out).code(), Code::kNotReady);
  EXPECT_EQ(store.ApplyRows(*id, keys, std::vector<float>{1, 1, 1, 1}).code(),
            Code::kNotReady);
  EXPECT_EQ(store.counts().sparse_rows, 0u);
  ASSERT_TRUE(store
                  .ProvideRows(*id, std::vector<uint64_t>{3},
                               std::vector<float>{0.5f, -0.5f})
                  .ok());
  EXPECT_EQ(store.ReadRows(*id, keys, out).code(), Code::kNotReady);  // 7
  ASSERT_TRUE(
      store.ProvideRows(*id, keys, std::vector<float>{8, 8, 1, 2}).ok());
  ASSERT_TRUE(store.ReadRows(*id, keys, out).ok());
  // Row 3 kept its first values; row 7 took the second provider's.
  EXPECT_EQ(out, (std::vector<float>{0.5f, -0.5f, 1, 2}));
}

TEST(ParamStore, ProvidedValuesSurviveSnapshotAndRestore) {
  ParamStore store(kSeed, 4, Opt(OptimizerKind::kAdam));
  auto id = store.DefineTensor("w", {6}, kProvided);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store.ProvideBlock(*id, 0, std::vector<float>{1, 2, 3, 4}).ok());
  std::vector<TensorSnapshot> tensors;
  std::vector<TableSnapshot> tables;
  store.Snapshot(&tensors, &tables);

  ParamStore restored(kSeed, 4, Opt(OptimizerKind::kAdam));
  ASSERT_TRUE(restored.Restore(tensors, tables).ok());
  auto block = restored.ReadBlock(*id, 0);
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  EXPECT_EQ(std::vector<float>(block->begin(), block->end()),
            (std::vector<float>{1, 2, 3, 4}));
  // The block never provided is still waiting for its provider.
  EXPECT_EQ(restored.ReadBlock(*id, 1).status().code(), Code::kNotReady);
  EXPECT_TRUE(restored.DefineTensor("w", {6}, kProvided).ok());
}

}  // namespace
}  // namespace tether

// --- ParamStore: a push applied by several threads ---------------------------

namespace tether {
namespace {

TEST(ApplyPool, RunsEachPartOnceTheFirstOnTheCaller) {
  ApplyPool pool(3);
  EXPECT_EQ(pool.threads(), 3);
  std::vector<std::thread::id> ran(3);
  std::vector<int> calls(3, 0);
  pool.Run(3, [&](int part) {
    ran[part] = std::this_thread::get_id();
    ++calls[part];
  });
  EXPECT_EQ(calls, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(ran[0], std::this_thread::get_id());
  EXPECT_NE(ran[1], std::this_thread::get_id());
  EXPECT_NE(ran[2], std::this_thread::get_id());
  EXPECT_EQ(pool.spread_runs(), 1u);
  EXPECT_GE(ApplyPool(0).threads(), 1);  // one per core
  ApplyPool alone(1);
  alone.Run(2, [&](int part) { ran[part] = std::this_thread::get_id(); });
  EXPECT_EQ(ran[1], std::this_thread::get_id());
  EXPECT_EQ(alone.spread_runs(), 0u);
}

// A push of a large tensor applied by a pool of threads leaves every weight,
// slot and update count as applying its blocks one at a time does, to the
// bit: a block whose update overflows is refused (named, unchanged) while
// the others apply, a block a reply still shares is not written, and a
// block given twice is applied twice in order.
TEST(ParamStore, ApplyBlocksOnAPoolIsBitIdenticalToOneBlockAtATime) {
  constexpr uint32_t kBlock = 65536;
  constexpr uint64_t kNumel = 20 * uint64_t{kBlock} + 123;  // 21 blocks
  static_assert(kNumel >= ParamStore::kParallelApplyFloats);
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    SCOPED_TRACE(OptimizerName(kind));
    // A rate at which a gradient of 3e38 overflows every optimizer.
    ParamStore pooled(kSeed, kBlock, Opt(kind, 10.0f));
    ParamStore plain(kSeed, kBlock, Opt(kind, 10.0f));
    auto id = pooled.DefineTensor("big", {kNumel}, Uniform(0.5f));
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(plain.DefineTensor("big", {kNumel}, Uniform(0.5f)).ok());
    ApplyPool pool(4);
    std::vector<float> grad(kNumel);
    uint32_t state = 1;
    for (float& g : grad) {
      state = state * 1664525u + 1013904223u;
      g = static_cast<float>(state >> 8) / (1 << 24) - 0.5f;
    }
    const uint32_t blocks = (kNumel + kBlock - 1) / kBlock;
    auto block_grad = [&](uint32_t b) {
      return std::span<const float>(grad).subspan(
          uint64_t{b} * kBlock,
          std::min<uint64_t>(kBlock, kNumel - uint64_t{b} * kBlock));
    };
    for (int step = 0; step < 3; ++step) {
      // Step 1: block 7 overflows; step 2: block 3 is pushed twice.
      std::vector<float> huge;
      std::vector<ParamStore::BlockGrad> grads;
      for (uint32_t b = 0; b < blocks; ++b) grads.push_back({b, block_grad(b)});
      if (step == 1) {
        huge.assign(kBlock, 3e38f);
        grads[7].grad = huge;
      }
      if (step == 2) grads.push_back({3, block_grad(3)});
      // A reply is still sending block 5 of the pooled store.
      auto shared = pooled.ShareBlock(*id, 5);
      ASSERT_TRUE(shared.ok());
      const std::vector<float> sent(shared->values.begin(),
                                    shared->values.end());
      const uint64_t spread = pool.spread_runs();
      Status s = pooled.ApplyBlocks(*id, grads, 0.5f, &pool);
      EXPECT_EQ(pool.spread_runs(), spread + (step == 2 ? 0 : 1))
          << "a push of " << kNumel
          << " floats is spread, unless a block repeats";
      EXPECT_TRUE(std::equal(sent.begin(), sent.end(), shared->values.begin()));
      Status expected;
      for (const ParamStore::BlockGrad& g : grads) {
        Status one = plain.ApplyBlock(*id, g.block, g.grad, 0.5f);
        if (expected.ok()) expected = one;
      }
      EXPECT_EQ(s.code(), expected.code()) << s.ToString();
      EXPECT_EQ(s.message(), expected.message());
      if (step == 1) {
        EXPECT_EQ(s.code(), Code::kNonFinite);
        EXPECT_TRUE(Contains(s.message(), "block 7")) << s.message();
      }
      const std::vector<float> a = ReadAll(pooled, *id),
                               b = ReadAll(plain, *id);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    }
    // Slots and update counts too: a snapshot of each holds the same bytes.
    std::vector<TensorSnapshot> ta, tb;
    std::vector<TableSnapshot> ra, rb;
    pooled.Snapshot(&ta, &ra);
    plain.Snapshot(&tb, &rb);
    ASSERT_EQ(ta.size(), 1u);
    ASSERT_EQ(tb.size(), 1u);
    ASSERT_EQ(ta[0].blocks.size(), tb[0].blocks.size());
    std::sort(ta[0].blocks.begin(), ta[0].blocks.end(),
              [](const auto& x, const auto& y) { return x.index < y.index; });
    std::sort(tb[0].blocks.begin(), tb[0].blocks.end(),
              [](const auto& x, const auto& y) { return x.index < y.index; });
    for (size_t i = 0; i < ta[0].blocks.size(); ++i) {
      EXPECT_EQ(ta[0].blocks[i].step, tb[0].blocks[i].step) << "block " << i;
      const std::span<const float> sa = ta[0].blocks[i].Slots(),
                                   sb = tb[0].blocks[i].Slots();
      ASSERT_EQ(sa.size(), sb.size());
      EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0)
          << "block " << i;
    }
  }
}

}  // namespace
}  // namespace tether
