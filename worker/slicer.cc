#include "worker/slicer.h"

#include "schema/slicing.h"

namespace tether {

Slicer DefaultSlicer() {
  // The rule lives in schema/slicing.h: shards apply it too when they take
  // their part of a round written by another number of shards.
  return Slicer{DefaultDenseShard, DefaultSparseShard};
}

}  // namespace tether
