// Built only by the Layering test (tests/CMakeLists.txt), with the include
// roots of the server library: worker/ is not among them, so this include
// must fail to compile. If it compiles, server code could depend on the
// worker's headers unnoticed.
#include "server/shard.h"
#include "worker/client.h"
