/* nbdkit-fscache-filter: nbdkit's "no connection in this thread" kept
 * out of the log while the filter opens a context of its own (quiet.c
 * says why and how).
 */
#ifndef FSC_PLUGIN_QUIET_H
#define FSC_PLUGIN_QUIET_H

#include <stdbool.h>

/* Before opening a context of our own on a plugin that asks for the
 * export name: from now to quiet_end () nbdkit's line is dropped from
 * its stderr.  False if it cannot be (nbdkit logs to syslog, or no
 * pipe or thread): the line will appear.
 */
extern bool quiet_begin (void);

/* After that open, when quiet_begin () returned true. */
extern void quiet_end (void);

#endif /* FSC_PLUGIN_QUIET_H */
