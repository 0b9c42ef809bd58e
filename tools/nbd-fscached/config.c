/* nbd-fscached: the configuration file (nbd-fscached.conf(5)).
 *
 * The language is cachefilesd's: one command per line, "#" comments on
 * lines of their own, blank lines ignored.  Commands:
 *
 *   dir PATH               the cache directory (mandatory, once)
 *   brun|bcull|bstop N%    free block thresholds (default 10 7 3)
 *   frun|fcull|fstop N%    free file thresholds  (default 10 7 3)
 *   max-size SIZE          cap on the allocated bytes of objects/
 *   culltable N            log2 of the cull table, 12 .. 20 (12)
 *   nocull                 never cull nor set quotas: only the stop mark
 *   tag NAME               a name shown in the log
 *   debug N                debug level, as N times -d
 *   secctx LABEL           accepted for cachefilesd's files, ignored
 *
 * Every value is checked where it is parsed, and the six percentages
 * once the whole file is read, so that their order in the file does
 * not matter: 0 <= stop < cull < run < 100 for each triple.  A
 * violation is reported at the later of the two lines involved.  Last,
 * the directory must be an nbd-fscache cache, which libfscache decides
 * (fsc_cache_open with .existing): we never parse its header here.
 *
 * Errors are "FILE:LINE: message", as cachefilesd's; nothing is
 * printed here, the caller decides where the message goes (stderr at
 * start, the log on SIGHUP).
 */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fscache.h"
#include "fscached.h"

#define MAX_LINE 4096

static const char *const pct_names[FSCD_NPCT] = {
  "brun", "bcull", "bstop", "frun", "fcull", "fstop",
};
/* cachefilesd's example configuration; its built-in defaults are
 * 7/5/1 (see nbd-fscached.conf(5)).
 */
static const unsigned pct_defaults[FSCD_NPCT] = { 10, 7, 3, 10, 7, 3 };

void
fscd_config_free (struct fscd_config *cfg)
{
  free (cfg->file);
  free (cfg->dir);
  free (cfg->tag);
  memset (cfg, 0, sizeof *cfg);
}

int
fscd_parse_size (const char *s, uint64_t *out)
{
  uint64_t v = 0, mult = 1;
  const char *p = s;

  if (!isdigit ((unsigned char) *p))
    return -1;
  for (; isdigit ((unsigned char) *p); ++p) {
    if (__builtin_mul_overflow (v, 10, &v) ||
        __builtin_add_overflow (v, (uint64_t) (*p - '0'), &v))
      return -1;
  }
  switch (*p) {
  case '\0': break;
  case 'k': case 'K': mult = UINT64_C (1) << 10; p++; break;
  case 'm': case 'M': mult = UINT64_C (1) << 20; p++; break;
  case 'g': case 'G': mult = UINT64_C (1) << 30; p++; break;
  case 't': case 'T': mult = UINT64_C (1) << 40; p++; break;
  default: return -1;
  }
  if (*p != '\0' || __builtin_mul_overflow (v, mult, &v))
    return -1;
  *out = v;
  return 0;
}

/* "N%" with 0 <= N < 100. */
static int
parse_pct (const char *s, unsigned *out)
{
  unsigned v = 0;
  const char *p = s;

  if (!isdigit ((unsigned char) *p))
    return -1;
  for (; isdigit ((unsigned char) *p); ++p) {
    v = v * 10 + (unsigned) (*p - '0');
    if (v >= 100)
      return -1;
  }
  if (p[0] != '%' || p[1] != '\0')
    return -1;
  *out = v;
  return 0;
}

/* A plain decimal number of at most 9 digits. */
static int
parse_uint (const char *s, unsigned *out)
{
  unsigned v = 0;
  size_t n = 0;

  for (; isdigit ((unsigned char) *s); ++s) {
    if (++n > 9)
      return -1;
    v = v * 10 + (unsigned) (*s - '0');
  }
  if (n == 0 || *s != '\0')
    return -1;
  *out = v;
  return 0;
}

/* Check one threshold triple, RUN, CULL, STOP indexes into pct[]. */
static int
check_triple (const struct fscd_config *cfg, int run, int cull, int stop,
              char *err, size_t errlen)
{
  const unsigned *p = cfg->pct, *l = cfg->pct_line;

  if (p[cull] >= p[run]) {
    snprintf (err, errlen, "%s:%u: %s %u%% must be below %s %u%%",
              cfg->file, l[cull] > l[run] ? l[cull] : l[run],
              pct_names[cull], p[cull], pct_names[run], p[run]);
    return -1;
  }
  if (p[stop] >= p[cull]) {
    snprintf (err, errlen, "%s:%u: %s %u%% must be below %s %u%%",
              cfg->file, l[stop] > l[cull] ? l[stop] : l[cull],
              pct_names[stop], p[stop], pct_names[cull], p[cull]);
    return -1;
  }
  return 0;
}

/* Parse one line (without its newline) into CFG.  Returns 0 or -1
 * with the message (without the "FILE:LINE: " prefix) in WHY.
 */
static int
parse_line (struct fscd_config *cfg, char *line, unsigned lineno,
            char *why, size_t whylen)
{
  char *cmd, *arg, *end;
  size_t len;

  for (cmd = line; isspace ((unsigned char) *cmd); ++cmd)
    ;
  len = strlen (cmd);
  while (len > 0 && isspace ((unsigned char) cmd[len - 1]))
    cmd[--len] = '\0';
  if (*cmd == '\0' || *cmd == '#')
    return 0;
  for (end = cmd; *end && !isspace ((unsigned char) *end); ++end)
    ;
  arg = end;
  if (*arg) {
    *arg++ = '\0';
    while (isspace ((unsigned char) *arg))
      ++arg;
  }

  for (int i = 0; i < FSCD_NPCT; ++i) {
    if (strcmp (cmd, pct_names[i]) == 0) {
      if (parse_pct (arg, &cfg->pct[i]) == -1) {
        snprintf (why, whylen, "%s: bad percentage '%s' "
                  "(expected N%% with 0 <= N < 100)", cmd, arg);
        return -1;
      }
      cfg->pct_line[i] = lineno;
      return 0;
    }
  }

  if (strcmp (cmd, "dir") == 0) {
    if (cfg->dir) {
      snprintf (why, whylen, "dir: given twice (first at line %u)",
                cfg->dir_line);
      return -1;
    }
    if (*arg == '\0') {
      snprintf (why, whylen, "dir: missing directory");
      return -1;
    }
    if (strlen (arg) > 4000) {
      snprintf (why, whylen, "dir: path too long");
      return -1;
    }
    if ((cfg->dir = strdup (arg)) == NULL) {
      snprintf (why, whylen, "%s", strerror (errno));
      return -1;
    }
    cfg->dir_line = lineno;
    return 0;
  }
  if (strcmp (cmd, "max-size") == 0) {
    if (fscd_parse_size (arg, &cfg->max_size) == -1 || cfg->max_size == 0) {
      snprintf (why, whylen, "max-size: bad size '%s' (expected a "
                "number > 0, optionally with K, M, G or T)", arg);
      return -1;
    }
    return 0;
  }
  if (strcmp (cmd, "culltable") == 0) {
    if (parse_uint (arg, &cfg->culltable) == -1) {
      snprintf (why, whylen, "culltable: bad number '%s'", arg);
      return -1;
    }
    if (cfg->culltable < FSCD_CULLTABLE_MIN ||
        cfg->culltable > FSCD_CULLTABLE_MAX) {
      snprintf (why, whylen, "culltable: log2 of the cull table size "
                "must be %d <= N <= %d", FSCD_CULLTABLE_MIN,
                FSCD_CULLTABLE_MAX);
      return -1;
    }
    return 0;
  }
  if (strcmp (cmd, "debug") == 0) {
    if (parse_uint (arg, &cfg->debug) == -1) {
      snprintf (why, whylen, "debug: bad number '%s'", arg);
      return -1;
    }
    return 0;
  }
  if (strcmp (cmd, "tag") == 0) {
    if (*arg == '\0' || strlen (arg) > 255) {
      snprintf (why, whylen, "tag: expected a name of 1 to 255 bytes");
      return -1;
    }
    free (cfg->tag);
    if ((cfg->tag = strdup (arg)) == NULL) {
      snprintf (why, whylen, "%s", strerror (errno));
      return -1;
    }
    return 0;
  }
  if (strcmp (cmd, "nocull") == 0) {
    if (*arg) {
      snprintf (why, whylen, "nocull: takes no argument");
      return -1;
    }
    cfg->nocull = true;
    return 0;
  }
  if (strcmp (cmd, "secctx") == 0)
    return 0;                   /* cachefilesd's; nothing to do here */

  snprintf (why, whylen, "unknown command '%s'", cmd);
  return -1;
}

int
fscd_config_read (const char *file, struct fscd_config *cfg,
                  char *err, size_t errlen)
{
  FILE *fp;
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  unsigned lineno = 0;
  char why[512];

  memset (cfg, 0, sizeof *cfg);
  for (int i = 0; i < FSCD_NPCT; ++i)
    cfg->pct[i] = pct_defaults[i];
  cfg->culltable = FSCD_CULLTABLE_DEFAULT;
  if ((cfg->file = strdup (file)) == NULL) {
    snprintf (err, errlen, "%s: %s", file, strerror (errno));
    return -1;
  }

  fp = fopen (file, "re");
  if (fp == NULL) {
    snprintf (err, errlen, "%s: %s", file, strerror (errno));
    goto fail;
  }
  while ((n = getline (&line, &cap, fp)) != -1) {
    lineno++;
    if (memchr (line, '\0', (size_t) n) != NULL) {
      snprintf (err, errlen, "%s:%u: line contains a NUL byte",
                file, lineno);
      goto fail_close;
    }
    if (n > MAX_LINE) {
      snprintf (err, errlen, "%s:%u: line too long", file, lineno);
      goto fail_close;
    }
    if (n > 0 && line[n - 1] == '\n')
      line[n - 1] = '\0';
    if (parse_line (cfg, line, lineno, why, sizeof why) == -1) {
      snprintf (err, errlen, "%s:%u: %s", file, lineno, why);
      goto fail_close;
    }
  }
  if (ferror (fp)) {
    snprintf (err, errlen, "%s: %s", file, strerror (errno));
    goto fail_close;
  }
  fclose (fp);
  free (line);
  line = NULL;

  if (check_triple (cfg, FSCD_BRUN, FSCD_BCULL, FSCD_BSTOP,
                    err, errlen) == -1 ||
      check_triple (cfg, FSCD_FRUN, FSCD_FCULL, FSCD_FSTOP,
                    err, errlen) == -1)
    goto fail;
  if (cfg->dir == NULL) {
    snprintf (err, errlen, "%s:%u: no 'dir' command", file, lineno);
    goto fail;
  }
  if (fscd_check_dir (cfg->dir, why, sizeof why) == -1) {
    snprintf (err, errlen, "%s:%u: %s", file, cfg->dir_line, why);
    goto fail;
  }
  /* The daemon changes to "/": keep the directory as an absolute path. */
  char *abs = realpath (cfg->dir, NULL);
  if (abs == NULL) {
    snprintf (err, errlen, "%s:%u: %s: %s", file, cfg->dir_line, cfg->dir,
              strerror (errno));
    goto fail;
  }
  free (cfg->dir);
  cfg->dir = abs;
  return 0;

 fail_close:
  fclose (fp);
 fail:
  free (line);
  fscd_config_free (cfg);
  return -1;
}
