// TETHER_VECTOR_CLONES before a function definition builds the function
// three times, for x86-64's baseline (SSE2), AVX2 and AVX-512, and the
// loader picks one by the CPU it runs on: for the loops over every value
// of a push or a pull (the optimizers, the finiteness scan, the bfloat16
// conversions). Other compilers, other CPUs and AddressSanitizer builds
// get the function once, as written.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define TETHER_VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TETHER_VECTOR_CLONES
#endif
