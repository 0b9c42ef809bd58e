/* Tiny assertion helpers for the unit tests of core/.  A failed check
 * prints where and exits 1 (automake counts the test as FAIL).
 */
#ifndef FSC_UNIT_H
#define FSC_UNIT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf (stderr, "%s:%d: check failed: %s\n",                     \
               __FILE__, __LINE__, #cond);                              \
      exit (1);                                                         \
    }                                                                   \
  } while (0)

#define CHECK_EQ(a, b)                                                  \
  do {                                                                  \
    unsigned long long a_ = (a), b_ = (b);                              \
    if (a_ != b_) {                                                     \
      fprintf (stderr, "%s:%d: %s == %llu, expected %s == %llu\n",      \
               __FILE__, __LINE__, #a, a_, #b, b_);                     \
      exit (1);                                                         \
    }                                                                   \
  } while (0)

#endif /* FSC_UNIT_H */
