/* nbdkit-fscache-filter: what an object caches, in words (issue 45).
 *
 * An object's key is its identity, and without fscache-key it is a
 * hash of the plugin's parameters (they may hold passwords): the tools
 * showed "#b3d773a24e0d" for every such export, and an operator could
 * not tell which image was which.  So each object also records a
 * label (core: the superblock's, for people only): the plugin, the
 * parameters that name the image, and the export; fscache-key's value
 * where given.
 *
 * Secrets stay out by a list of what may go in, not of what may not:
 * only the parameters below, and of a URL only its scheme, host, port
 * and path (no user, password, query or fragment: presigned S3 URLs
 * carry their signature in the query).  Other parameters (password=,
 * header=, cookie=, identity=, ...) are never shown, whatever they are
 * called.
 */
#include <config.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "label.h"
#include "ownctx.h"
#include "params.h"

/* Parameters that name an image or where it is, in any plugin that
 * takes them; those that are URLs are cut to scheme://host:port/path.
 */
static const struct {
  const char *key;
  bool url;
} shown[] = {
  { "file", false }, { "dir", false }, { "path", false },
  { "socket", false }, { "hostname", false }, { "host", false },
  { "port", false }, { "export", false }, { "size", false },
  { "url", true }, { "uri", true },
};

static char *base;              /* "k=v k=v", as they came */

/* scheme://host[:port]/path of URL: no user information, query or
 * fragment.
 */
static char *
url_shown (const char *url)
{
  const char *scheme_end = strstr (url, "://");
  if (scheme_end == NULL)
    return strndup (url, strcspn (url, "?#"));
  const char *auth = scheme_end + 3;
  size_t alen = strcspn (auth, "/?#");
  const char *at = memrchr (auth, '@', alen);
  const char *host = at ? at + 1 : auth;
  size_t hlen = alen - (size_t) (host - auth);
  const char *path = auth + alen;
  size_t plen = strcspn (path, "?#");
  char *out;
  if (asprintf (&out, "%.*s%.*s%.*s", (int) (auth - url), url, (int) hlen,
                host, (int) plen, path) == -1)
    return NULL;
  return out;
}

void
label_config (const char *key, const char *value)
{
  for (size_t i = 0; i < sizeof shown / sizeof shown[0]; ++i) {
    if (strcmp (key, shown[i].key) != 0)
      continue;
    char *v = shown[i].url ? url_shown (value) : strdup (value);
    char *b = NULL;
    if (v && asprintf (&b, "%s%s%s=%s", base ? base : "", base ? " " : "",
                       key, v) != -1) {
      free (base);
      base = b;
    }
    free (v);
    return;
  }
}

char *
label_of (const char *exportname)
{
  char *out;
  if (params.key) {
    if (asprintf (&out, "%s%s%s", params.key, *exportname ? "/" : "",
                  exportname) == -1)
      return NULL;
    return out;
  }
  const char *plugin = ownctx_plugin_name ();
  if (asprintf (&out, "%s%s%s%s%s", plugin && *plugin ? plugin : "plugin",
                base ? " " : "", base ? base : "",
                *exportname ? " export=" : "", exportname) == -1)
    return NULL;
  return out;
}

void
label_free (void)
{
  free (base);
  base = NULL;
}
