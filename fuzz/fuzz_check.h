// The harness invariants' assertion: a violated invariant is a crash, which
// libFuzzer records with the input that caused it, like a sanitizer report.
#pragma once

#include <cstdio>

#define FUZZ_CHECK(cond)                                                                    \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                                     \
    }                                                                                       \
  } while (0)
