/* nbdkit-fscache-filter: may the filter open upstream contexts of its
 * own, outside a client's connection? (ownctx.c says why it asks.)
 */
#ifndef FSC_PLUGIN_OWNCTX_H
#define FSC_PLUGIN_OWNCTX_H

#include <stdbool.h>

/* .config: a plugin parameter (one the filter passes on), kept if it
 * decides how the plugin opens (file's dir=, info's mode=, nbd's
 * dynamic-export= and shared=).
 */
extern void ownctx_config (const char *key, const char *value);

/* .get_ready: find which plugin serves (its shared object's name). */
extern void ownctx_init (void);

/* The plugin's name ("file", "curl", ...), or "" if not known. */
extern const char *ownctx_plugin_name (void);

/* Before a context of the filter's own is opened: if the plugin will
 * log nbdkit's "no connection in this thread" about it, which is not an
 * error, keep it out of the log (quiet.c) and return true: the caller
 * calls quiet_end () after the open.  Where the line cannot be kept out
 * (nbdkit logs to syslog), say once in a note that it is expected.
 */
extern bool ownctx_opening (void);

/* May the pool, the catch-up worker, the shared view and the
 * writeback writer open contexts of their own on EXPORTNAME (the
 * canonical name the client's connection opened)?  Not under
 * serialize_connections; else as the plugin allows, and the first time
 * it does not, says why once (a note).
 */
extern bool ownctx_allowed (const char *exportname);

#endif /* FSC_PLUGIN_OWNCTX_H */
