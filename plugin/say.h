/* nbdkit-fscache-filter: log lines that are not errors (say.c). */
#ifndef FSC_PLUGIN_SAY_H
#define FSC_PLUGIN_SAY_H

#include <stdbool.h>

/* A warning: something is off and the filter works around it (serving
 * uncached, starting cold, falling back); the operator should look.
 * "nbdkit: fscache: warning: " and the message, where nbdkit logs.
 */
extern void say_warning (const char *fs, ...)
  __attribute__ ((format (printf, 1, 2)));

/* A note: how the filter chose to run, said once, nothing to fix. */
extern void say_note (const char *fs, ...)
  __attribute__ ((format (printf, 1, 2)));

/* Does nbdkit log to stderr (not to syslog, not nowhere)? */
extern bool say_to_stderr (void);

#endif /* FSC_PLUGIN_SAY_H */
