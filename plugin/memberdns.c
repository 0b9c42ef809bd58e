/* nbdkit-fscache-filter: a fleet's members from the name system
 * (fscache-peers=dns:..., for members.c).
 *
 * Two forms, as the systems that keep a fleet's membership publish it:
 *
 *  - dns:NAME:PORT: NAME's addresses (A and AAAA records, through the
 *    system's resolver: /etc/hosts, DNS, whatever NSS says), each
 *    serving on PORT.  A Kubernetes headless Service's name, or a
 *    Consul service's, lists its ready members.
 *  - dns:NAME (no port): NAME's SRV records (RFC 2782), each a target
 *    host and a port, every target's addresses taken from the answer's
 *    additional section where the server sent them (struct glue), else
 *    looked up as above: a
 *    Kubernetes headless Service's _PORTNAME._tcp.SERVICE... name, or
 *    Consul's SERVICE.service.consul, where members may serve on ports
 *    of their own.  Every record is a member: priority and weight
 *    choose among equivalent servers, and a fleet's members are not
 *    that (rendezvous hashing spreads the ranges over all of them).
 *    The SRV query goes to the resolver's DNS servers (res_query): NSS
 *    has no SRV.  A target of "." (RFC 2782: no service here) is none.
 *
 * The result is the text of a peers file, one nbd://ADDRESS:PORT line
 * per member (IPv6 in brackets), sorted and without duplicates, so that
 * members.c compares it with the last and keeps its snapshot when the
 * name's answer only came back in another order.  An answer with no
 * member in it fails, as no answer does.
 *
 * Untrusted input: the DNS answer.  Every length in it is checked
 * against the message's end before it is read (dn_expand checks the
 * names'); a malformed answer is a failed lookup (EBADMSG), which
 * members.c takes as "keep the last members".
 */
#include <config.h>

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "memberdns.h"

#define MAX_SRV 4096            /* records taken from one answer */
#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#endif

struct uris {
  char **v;
  size_t n, cap;
};

static int
cmp_str (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

static void
uris_add (struct uris *u, char *s)
{
  if (u->n == u->cap) {
    size_t cap = u->cap ? 2 * u->cap : 16;
    char **b = realloc (u->v, cap * sizeof *u->v);
    if (b == NULL) {
      free (s);
      return;
    }
    u->v = b;
    u->cap = cap;
  }
  u->v[u->n++] = s;
}

/* The address IN (of FAMILY) on PORT added to U as nbd://ADDRESS:PORT
 * (IPv6 in brackets).  False if it could not be (another family).
 */
static bool
uris_add_addr (struct uris *u, int family, const void *in, const char *port)
{
  char addr[INET6_ADDRSTRLEN], *s;
  if ((family != AF_INET && family != AF_INET6) ||
      inet_ntop (family, in, addr, sizeof addr) == NULL ||
      asprintf (&s, family == AF_INET6 ? "nbd://[%s]:%s" : "nbd://%s:%s",
                addr, port) == -1)
    return false;
  uris_add (u, s);
  return true;
}

/* HOST's addresses, each as nbd://ADDRESS:PORT, added to U.  0, or -1
 * with errno if HOST does not resolve.
 */
static int
add_addresses (struct uris *u, const char *host, const char *port)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                            .ai_family = AF_UNSPEC }, *res;
  int r = getaddrinfo (host, port, &hints, &res);
  if (r != 0) {
    nbdkit_debug ("fscache-peers: %s: %s", host, gai_strerror (r));
    errno = r == EAI_SYSTEM ? errno : ENOENT;
    return -1;
  }
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    const void *in = a->ai_family == AF_INET6
      ? (const void *) &((struct sockaddr_in6 *) a->ai_addr)->sin6_addr
      : (const void *) &((struct sockaddr_in *) a->ai_addr)->sin_addr;
    uris_add_addr (u, a->ai_family, in, port);
  }
  freeaddrinfo (res);
  return 0;
}

static uint16_t
get16 (const unsigned char *p)
{
  return (uint16_t) (p[0] << 8 | p[1]);
}

/* A target's addresses from the answer's additional section, as DNS
 * servers that publish SRV records send them (CoreDNS for Kubernetes,
 * Consul): with them a fleet's SRV answer needs no lookup per member,
 * where a lookup each, one after the other under the membership's
 * lock, made a read wait for as many round trips as there are members.
 */
struct glue {
  char *name;
  int family;
  unsigned char addr[16];
};

/* Add TARGET's addresses from GLUE (N records) to U as
 * nbd://ADDRESS:PORT; true if there were any.
 */
static bool
add_glue (struct uris *u, const struct glue *glue, size_t n,
          const char *target, const char *port)
{
  bool any = false;
  for (size_t i = 0; i < n; ++i)
    if (strcasecmp (glue[i].name, target) == 0)
      any |= uris_add_addr (u, glue[i].family, glue[i].addr, port);
  return any;
}

/* One resource record at *P (before END): its owner name into NAME,
 * type, class and data (*RD, *RDLEN); *P moves past it.  0, or -1
 * (EBADMSG) if it does not fit the message.
 */
static int
next_rr (const unsigned char *msg, const unsigned char *end,
         const unsigned char **p, char *name, size_t namelen,
         unsigned *type, unsigned *class, const unsigned char **rd,
         unsigned *rdlen)
{
  int n = dn_expand (msg, end, *p, name, namelen);
  if (n < 0 || end - (*p + n) < NS_RRFIXEDSZ) {
    errno = EBADMSG;
    return -1;
  }
  const unsigned char *q = *p + n;
  *type = get16 (q);
  *class = get16 (q + 2);
  *rdlen = get16 (q + 8);
  q += NS_RRFIXEDSZ;
  if (end - q < (ptrdiff_t) *rdlen) {
    errno = EBADMSG;
    return -1;
  }
  *rd = q;
  *p = q + *rdlen;
  return 0;
}

/* NAME's SRV records (the answer read into MSG, of CAP bytes), their
 * targets' addresses (from the additional section, else looked up)
 * added to U.  0, or -1 with errno (ENOENT: no such name or no
 * records; EBADMSG: a malformed answer).  A target that does not
 * resolve is left out (said in the debug log): the others are still
 * members.
 */
static int
srv_answer (struct uris *u, const char *name, unsigned char *msg,
            size_t cap)
{
  int len = res_query (name, ns_c_in, ns_t_srv, msg, cap);
  if (len < 0) {
    nbdkit_debug ("fscache-peers=dns:%s: no SRV records (h_errno %d)",
                  name, h_errno);
    errno = ENOENT;
    return -1;
  }
  if ((size_t) len > cap)       /* truncated by res_query */
    len = cap;
  if (len < NS_HFIXEDSZ) {
    errno = EBADMSG;
    return -1;
  }
  const unsigned char *end = msg + len, *p = msg + NS_HFIXEDSZ;
  unsigned qd = get16 (msg + 4);
  unsigned nrr = get16 (msg + 6) + get16 (msg + 8) + get16 (msg + 10);
  unsigned an = get16 (msg + 6);
  char host[NS_MAXDNAME];
  for (unsigned i = 0; i < qd; ++i) {
    int n = dn_expand (msg, end, p, host, sizeof host);
    if (n < 0 || end - (p + n) < NS_QFIXEDSZ) {
      errno = EBADMSG;
      return -1;
    }
    p += n + NS_QFIXEDSZ;
  }
  /* Every record first: the SRV ones of the answer, the addresses of
   * any section after it.  A record takes 11 bytes at least: the
   * counts a hostile header claims are cut to what the message holds.
   */
  nrr = MIN (nrr, (unsigned) ((end - p) / 11));
  an = MIN (an, nrr);
  struct srv { char *target; unsigned port; } *srv =
    calloc (an ? an : 1, sizeof *srv);
  struct glue *glue = calloc (nrr ? nrr : 1, sizeof *glue);
  size_t nsrv = 0, nglue = 0;
  int r = srv && glue ? 0 : -1;
  for (unsigned i = 0; r == 0 && i < nrr; ++i) {
    unsigned type, class, rdlen;
    const unsigned char *rd;
    if (next_rr (msg, end, &p, host, sizeof host, &type, &class, &rd,
                 &rdlen) == -1) {
      r = -1;
      break;
    }
    if (class != ns_c_in)
      continue;
    if (i < an && type == ns_t_srv) {
      /* Priority, weight, port, target. */
      char t[NS_MAXDNAME];
      if (rdlen < 7 || dn_expand (msg, end, rd + 6, t, sizeof t) < 0) {
        errno = EBADMSG;
        r = -1;
        break;
      }
      if ((srv[nsrv].target = strdup (t)) == NULL) {
        r = -1;
        break;
      }
      srv[nsrv++].port = get16 (rd + 4);
    }
    else if (i >= an && ((type == ns_t_a && rdlen == 4) ||
                         (type == ns_t_aaaa && rdlen == 16))) {
      if ((glue[nglue].name = strdup (host)) == NULL) {
        r = -1;
        break;
      }
      glue[nglue].family = type == ns_t_a ? AF_INET : AF_INET6;
      memcpy (glue[nglue++].addr, rd, rdlen);
    }
    /* Anything else (a CNAME res_query followed, an NS record): not
     * ours.
     */
  }
  for (size_t i = 0; r == 0 && i < nsrv && i < MAX_SRV; ++i) {
    const char *t = srv[i].target;
    char port[8];
    snprintf (port, sizeof port, "%u", srv[i].port);
    if (t[0] == 0 || strcmp (t, ".") == 0)
      continue;                 /* "no service here" */
    if (!add_glue (u, glue, nglue, t, port) &&
        add_addresses (u, t, port) == -1)
      nbdkit_debug ("fscache-peers=dns:%s: target %s does not resolve",
                    name, t);
  }
  if (r == 0 && nsrv == 0) {
    errno = ENOENT;
    r = -1;
  }
  int e = errno;
  for (size_t i = 0; srv && i < nsrv; ++i)
    free (srv[i].target);
  for (size_t i = 0; glue && i < nglue; ++i)
    free (glue[i].name);
  free (srv);
  free (glue);
  errno = e;
  return r;
}

static int
add_srv (struct uris *u, const char *name)
{
  const size_t cap = 65536;     /* the largest DNS message */
  unsigned char *msg = malloc (cap);
  if (msg == NULL)
    return -1;
  int r = srv_answer (u, name, msg, cap);
  int e = errno;
  free (msg);
  errno = e;
  return r;
}

char *
member_dns_text (const char *spec)
{
  const char *name = spec + 4, *colon = strrchr (name, ':');
  struct uris u = { 0 };
  int r;
  if (colon == NULL)
    r = add_srv (&u, name);
  else {
    char host[NS_MAXDNAME];
    size_t hl = colon - name;
    if (hl >= sizeof host) {
      errno = ENAMETOOLONG;
      return NULL;
    }
    memcpy (host, name, hl);
    host[hl] = 0;
    r = add_addresses (&u, host, colon + 1);
  }
  /* An answer that leaves no member (only "." targets, no target that
   * resolves) is taken as a failed lookup, which keeps the last
   * members: the fleet is never emptied by one bad answer
   * (test-fscache-peers-dns.sh part 4: it was).
   */
  if (r == 0 && u.n == 0) {
    r = -1;
    errno = ENOENT;
  }
  int e = errno;
  if (r == 0)
    qsort (u.v, u.n, sizeof *u.v, cmp_str);
  char *text = NULL;
  size_t len = 0;
  FILE *fp = r == 0 ? open_memstream (&text, &len) : NULL;
  for (size_t i = 0; i < u.n; ++i) {
    if (fp && (i == 0 || strcmp (u.v[i], u.v[i - 1]) != 0))
      fprintf (fp, "%s\n", u.v[i]);
    free (u.v[i]);
  }
  free (u.v);
  if (r == -1) {
    errno = e;
    return NULL;
  }
  if (fp == NULL || fclose (fp) == EOF) {
    free (text);
    errno = ENOMEM;
    return NULL;
  }
  return text;
}
