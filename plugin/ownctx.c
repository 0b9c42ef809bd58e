/* nbdkit-fscache-filter: whether the filter may open upstream contexts
 * of its own (issue 40).
 *
 * The pool (pool.c), the catch-up worker (catchup.c), the shared view
 * (view.c) and the writeback writer (writeback.c) each open a context
 * on the upstream outside any client's connection
 * (nbdkit_next_context_open with no connection).  nbdkit 1.32 runs the
 * plugin's .open there with no connection: nbdkit_export_name ()
 * fails (it logs "no connection in this thread" and returns NULL).
 * It cannot be opened on a client's connection either: nbdkit keeps
 * one export name per connection, for the one context of the plugin
 * the connection has, and asserts that there is no second one
 * (server/plugins.c, plugin_open), so a filter gets exactly one context
 * with a name per client connection, the client's own.
 *
 * So a context of our own is the client's export only if the plugin
 * opens the same thing whatever the name.  A plugin that reads the
 * name behaves three ways: the file plugin with dir= dereferences the
 * NULL (SIGSEGV: the whole server, every client); the nbd plugin with
 * dynamic-export=true asserts; ondemand and info refuse the open, and
 * the sh and eval plugins pass "" to their script, which then serves
 * its default export (the wrong data for any other).  The filter
 * cannot see inside a plugin, so it decides from the plugin's name and
 * the parameters that change how it opens:
 *
 *   ANY      the same export whatever the name: contexts of our own
 *            for every export.  The nbd plugin without dynamic-export
 *            is one (it asks for the name but does not use it; nbdkit
 *            logs its failed ask as an error, which the filter keeps
 *            out of stderr, quiet.c, and where it cannot, says once is
 *            expected: ownctx_opening).
 *   DEFAULT  the plugin asks for the name and gets "" (sh, eval):
 *            contexts of our own only for the export "".
 *   NONE     the plugin opens what the client names, or something
 *            different per connection (tmpdisk), or runs code the
 *            filter cannot read (the language plugins, and any plugin
 *            not in the table): none of our own.
 *
 * Without contexts of its own the filter runs without their users,
 * says so once, and serves every export correctly: no pool (misses on
 * the client's context), no catch-up (skipped fills are fetched again
 * by the next read of them), no shared view (each connection writes on
 * its own context), writeback written through (connect.c, wb_wanted).
 * tests/filter/test-fscache-any-plugin.sh runs every plugin of Debian 12's
 * nbdkit that needs no outside service in every mode.
 */
#include <config.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "ownctx.h"
#include "quiet.h"
#include "say.h"
#include "upstream.h"

enum own { OWN_ANY, OWN_DEFAULT, OWN_NONE };

/* The plugins of Debian 12's nbdkit (1.32) whose .open ignores the
 * connection, the parameters aside (decide () handles those).
 */
static const char *const any_plugins[] = {
  "cdi", "curl", "data", "example1", "example2", "example3", "file",
  "floppy", "full", "info", "iso", "linuxdisk", "memory", "nbd", "null",
  "partitioning", "pattern", "random", "sparse-random", "split", "ssh",
  "torrent", "vddk", "zero",
};

/* Plugins that pass the name on as "" when it fails. */
static const char *const default_plugins[] = { "sh", "eval" };

static char plugin[64];         /* its name, "" if unknown */
static char *file_dir;          /* file: dir= */
static char *info_mode;         /* info: mode= */
static bool nbd_dynamic;        /* nbd: dynamic-export=true */
static bool nbd_shared;         /* nbd: shared=true */
static enum own own = OWN_NONE;
static bool said;               /* the note (atomic) */

static bool
in (const char *name, const char *const *list, size_t n)
{
  for (size_t i = 0; i < n; ++i)
    if (strcmp (name, list[i]) == 0)
      return true;
  return false;
}

static void
keep (char **p, const char *value)
{
  free (*p);
  *p = strdup (value);
}

void
ownctx_config (const char *key, const char *value)
{
  if (strcmp (key, "dir") == 0)
    keep (&file_dir, value);
  else if (strcmp (key, "mode") == 0)
    keep (&info_mode, value);
  else if (strcmp (key, "dynamic-export") == 0)
    nbd_dynamic = nbdkit_parse_bool (value) == 1;
  else if (strcmp (key, "shared") == 0)
    nbd_shared = nbdkit_parse_bool (value) == 1;
}

/* The plugin's name from its shared object, nbdkit-NAME-plugin.so:
 * nbdkit loads the plugin RTLD_GLOBAL, and only a plugin defines
 * plugin_init (filters define filter_init).
 */
static void
find_plugin (void)
{
  void *sym = dlsym (RTLD_DEFAULT, "plugin_init");
  Dl_info info;
  if (sym == NULL || dladdr (sym, &info) == 0 || info.dli_fname == NULL)
    return;
  const char *base = strrchr (info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  const char *pre = "nbdkit-", *suf = "-plugin.so";
  size_t len = strlen (base);
  if (strncmp (base, pre, strlen (pre)) != 0 ||
      len <= strlen (pre) + strlen (suf) ||
      strcmp (base + len - strlen (suf), suf) != 0 ||
      len - strlen (pre) - strlen (suf) >= sizeof plugin)
    return;
  memcpy (plugin, base + strlen (pre), len - strlen (pre) - strlen (suf));
  plugin[len - strlen (pre) - strlen (suf)] = 0;
}

/* Decide OWN, and WHY when it is not ANY (for the note). */
static char why[160];

static enum own
decide (void)
{
  if (in (plugin, default_plugins,
          sizeof default_plugins / sizeof default_plugins[0])) {
    snprintf (why, sizeof why, "the %s plugin tells its script the export "
              "a client names", plugin);
    return OWN_DEFAULT;
  }
  if (*plugin == 0) {
    snprintf (why, sizeof why, "the plugin (not one the filter knows) may "
              "open the export a client names");
    return OWN_NONE;
  }
  if (!in (plugin, any_plugins, sizeof any_plugins / sizeof any_plugins[0])) {
    snprintf (why, sizeof why, "the %s plugin may open the export a client "
              "names or a disk of each connection's own", plugin);
    return OWN_NONE;
  }
  if (strcmp (plugin, "file") == 0 && file_dir) {
    snprintf (why, sizeof why, "the file plugin with dir= opens the file a "
              "client names");
    return OWN_NONE;
  }
  if (strcmp (plugin, "nbd") == 0 && nbd_dynamic && !nbd_shared) {
    snprintf (why, sizeof why, "the nbd plugin with dynamic-export=true "
              "opens the export a client names");
    return OWN_NONE;
  }
  /* info serves the export name by default (mode=exportname), or the
   * client's address; its other modes do not depend on the client.
   */
  if (strcmp (plugin, "info") == 0 &&
      (info_mode == NULL || strcmp (info_mode, "exportname") == 0 ||
       strcmp (info_mode, "base64exportname") == 0 ||
       strcmp (info_mode, "address") == 0)) {
    snprintf (why, sizeof why, "the info plugin serves the export name or "
              "the address of a client's connection");
    return OWN_NONE;
  }
  return OWN_ANY;
}

void
ownctx_init (void)
{
  find_plugin ();
  own = decide ();
  free (file_dir);
  free (info_mode);
  file_dir = info_mode = NULL;
  nbdkit_debug ("fscache: plugin \"%s\": contexts of the filter's own: %s",
                plugin, own == OWN_ANY ? "for every export" :
                own == OWN_DEFAULT ? "for the export \"\" only" : "none");
}

bool
ownctx_opening (void)
{
  static bool opening_said;
  if (!((strcmp (plugin, "nbd") == 0 && !nbd_shared) || own == OWN_DEFAULT))
    return false;
  if (quiet_begin ())
    return true;
  if (!__atomic_test_and_set (&opening_said, __ATOMIC_RELAXED))
    say_note ("the %s plugin logs \"no connection in this thread\" when "
              "the filter opens a connection of its own to the upstream "
              "(its pool, catch-up, shared view or writeback: nbdkit 1.32 "
              "gives the plugin no client's export name there, and it "
              "does not need one here): that line is expected: nothing "
              "failed", plugin);
  return false;
}

const char *
ownctx_plugin_name (void)
{
  return plugin;
}

bool
ownctx_allowed (const char *exportname)
{
  /* serialize_connections: one connection at a time, the client's. */
  if (!upstream_model_allows_shared ())
    return false;
  if (own == OWN_ANY || (own == OWN_DEFAULT && *exportname == 0))
    return true;
  if (!__atomic_test_and_set (&said, __ATOMIC_RELAXED))
    say_note ("export \"%s\": %s, and nbdkit 1.32 names no export to a "
              "context the filter opens outside a client's connection: "
              "the filter opens none of its own for such an export (no "
              "pool of upstream connections, no catch-up of skipped "
              "fills, and fscache-mode=writeback writes through)",
              exportname, why);
  return false;
}
