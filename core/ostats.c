/* libfscache: names of the object counters (ostats.h).  The counting
 * is where the events happen; publishing NAME.stats is in live.c.
 */
#include <config.h>

#include <string.h>

#include "ostats.h"

static const char *const names[FSC_OSTATS_COUNT] = {
#define FSC_OSTATS_NAME(name) #name,
  FSC_OSTATS_FIELDS (FSC_OSTATS_NAME)
#undef FSC_OSTATS_NAME
};

const char *
fsc_ostat_name (unsigned i)
{
  return i < FSC_OSTATS_COUNT ? names[i] : NULL;
}

int
fsc_ostat_index (const char *name)
{
  for (unsigned i = 0; i < FSC_OSTATS_COUNT; ++i)
    if (strcmp (names[i], name) == 0)
      return (int) i;
  return -1;
}
