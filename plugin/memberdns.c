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
 *    host and a port, every target's addresses taken as above: a
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
#include <sys/socket.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "memberdns.h"

#define MAX_SRV 4096            /* records taken from one answer */

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
    char addr[INET6_ADDRSTRLEN], *s;
    const void *in = a->ai_family == AF_INET6
      ? (const void *) &((struct sockaddr_in6 *) a->ai_addr)->sin6_addr
      : (const void *) &((struct sockaddr_in *) a->ai_addr)->sin_addr;
    if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) ||
        inet_ntop (a->ai_family, in, addr, sizeof addr) == NULL)
      continue;
    if (asprintf (&s, a->ai_family == AF_INET6 ? "nbd://[%s]:%s"
                  : "nbd://%s:%s", addr, port) != -1)
      uris_add (u, s);
  }
  freeaddrinfo (res);
  return 0;
}

static uint16_t
get16 (const unsigned char *p)
{
  return (uint16_t) (p[0] << 8 | p[1]);
}

/* NAME's SRV records (the answer read into MSG, of CAP bytes), their
 * targets' addresses added to U.  0, or -1 with errno (ENOENT: no such
 * name or no records; EBADMSG: a malformed answer).  A target that does not resolve is left out (said in the
 * debug log): the others are still members.
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
  const unsigned char *end = msg + len, *p = msg + NS_HFIXEDSZ;
  if (len < NS_HFIXEDSZ) {
    errno = EBADMSG;
    return -1;
  }
  unsigned qd = get16 (msg + 4), an = get16 (msg + 6);
  char host[NS_MAXDNAME];
  for (unsigned i = 0; i < qd; ++i) {
    int n = dn_expand (msg, end, p, host, sizeof host);
    if (n < 0 || end - (p + n) < NS_QFIXEDSZ) {
      errno = EBADMSG;
      return -1;
    }
    p += n + NS_QFIXEDSZ;
  }
  unsigned taken = 0;
  for (unsigned i = 0; i < an && taken < MAX_SRV; ++i) {
    int n = dn_expand (msg, end, p, host, sizeof host);
    if (n < 0 || end - (p + n) < NS_RRFIXEDSZ) {
      errno = EBADMSG;
      return -1;
    }
    p += n;
    unsigned type = get16 (p), class = get16 (p + 2), rdlen = get16 (p + 8);
    p += NS_RRFIXEDSZ;
    if (end - p < (ptrdiff_t) rdlen) {
      errno = EBADMSG;
      return -1;
    }
    const unsigned char *rd = p;
    p += rdlen;
    /* Priority, weight, port, target; a CNAME in the answer is skipped
     * (res_query followed it: the SRV records follow it).
     */
    if (type != ns_t_srv || class != ns_c_in)
      continue;
    if (rdlen < 7 || dn_expand (msg, end, rd + 6, host, sizeof host) < 0) {
      errno = EBADMSG;
      return -1;
    }
    char port[8];
    snprintf (port, sizeof port, "%u", get16 (rd + 4));
    taken++;
    if (host[0] == 0 || strcmp (host, ".") == 0)
      continue;                 /* "no service here" */
    if (add_addresses (u, host, port) == -1)
      nbdkit_debug ("fscache-peers=dns:%s: target %s does not resolve",
                    name, host);
  }
  if (taken == 0) {
    errno = ENOENT;
    return -1;
  }
  return 0;
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
