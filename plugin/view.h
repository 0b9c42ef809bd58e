/* nbdkit-fscache-filter: one shared view of an upstream that can write
 * and offers no multi-conn (view.c says why and what it costs).
 */
#ifndef FSC_PLUGIN_VIEW_H
#define FSC_PLUGIN_VIEW_H

#include <stdbool.h>
#include <stdint.h>

#ifndef NBDKIT_API_VERSION
#define NBDKIT_API_VERSION 2
#endif
#include <nbdkit-filter.h>

struct upstream;
struct view;

/* .after_fork: the backend views are opened from. */
extern void view_set_backend (nbdkit_backend *backend);

/* Does a connection whose own context is U need the shared view?
 * (The upstream can write, offers no multi-conn, and its thread model
 * allows a context of ours.)  Asks U's can_* (gated).
 */
extern bool view_wanted (struct upstream *u);

/* The view of EXPORTNAME, opened if none, with a reference; NULL if it
 * cannot be opened, or its upstream has not SIZE bytes (said).  view_put drops the reference; the view
 * stays open until view_close_all.
 */
extern struct view *view_get (const char *exportname, uint64_t size);
/* The same if it is open already, else NULL. */
extern struct view *view_find (const char *exportname);
extern void view_put (struct view *v);

/* .cleanup: close every view (no connection is left). */
extern void view_close_all (void);

/* Its context, for data calls. */
extern struct upstream *view_upstream (struct view *v);

#endif /* FSC_PLUGIN_VIEW_H */
