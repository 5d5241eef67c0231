// TETHER_ASSIGN_OR_RETURN: the value on success, the first error unchanged.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "schema/status.h"

namespace tether {
namespace {

Result<int> Half(int n) {
  if (n % 2 != 0) return InvalidArgument("odd: " + std::to_string(n));
  return n / 2;
}

// Two uses in one scope: the temporaries' names must not clash.
Result<int> Quarter(int n) {
  TETHER_ASSIGN_OR_RETURN(auto half, Half(n));
  TETHER_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status QuarterInto(int n, int* out) {
  TETHER_ASSIGN_OR_RETURN(*out, Quarter(n));
  return Status::Ok();
}

Result<std::unique_ptr<int>> Boxed(int n) { return std::make_unique<int>(n); }

Result<int> Unboxed(int n) {
  TETHER_ASSIGN_OR_RETURN(std::unique_ptr<int> box, Boxed(n));
  return *box;
}

TEST(AssignOrReturn, DeclaresTheValueWhenOk) {
  Result<int> r = Quarter(12);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 3);
}

TEST(AssignOrReturn, ReturnsTheFirstErrorUnchanged) {
  Result<int> r = Quarter(6);  // 6 / 2 = 3 is odd
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "odd: 3");
}

TEST(AssignOrReturn, AssignsAnExistingVariableAndLeavesItAloneOnError) {
  int out = -1;
  ASSERT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
  out = -1;
  Status s = QuarterInto(5, &out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(out, -1);
}

TEST(AssignOrReturn, MovesAMoveOnlyValueOut) {
  Result<int> r = Unboxed(7);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 7);
}

TEST(AssignOrReturn, EvaluatesTheExpressionOnce) {
  int calls = 0;
  auto counted = [&]() -> Result<int> {
    ++calls;
    return 1;
  };
  auto use = [&]() -> Status {
    TETHER_ASSIGN_OR_RETURN(int v, counted());
    EXPECT_EQ(v, 1);
    return Status::Ok();
  };
  ASSERT_TRUE(use().ok());
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tether
