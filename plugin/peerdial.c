/* nbdkit-fscache-filter: dialling a fleet peer, as a link's new
 * connection or the prober's look at a peer set aside.
 *
 * Apart from peerlink.c, which carries reads over the connections this
 * makes, because a dial is a different kind of wait: libnbd's opt mode
 * (so that the export name is ours, not the URI's: it carries this
 * node's id and the link's token, peerlink.c), TLS as the fleet is
 * configured, and every step under the caller's one deadline
 * (invariant P3 of peers.c), driven with nbd_poll on a handle nobody
 * else has yet.
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <libnbd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "peerdial.h"
#include "utils.h"

static struct {
  const char *psk_file, *psk_user;
  const char *cert_dir;         /* fscache-peer-tls-certificates */
} cfg;

void
peer_dial_configure (const char *psk_file, const char *psk_user,
                     const char *cert_dir)
{
  cfg.psk_file = psk_file;
  cfg.psk_user = psk_user;
  cfg.cert_dir = cert_dir;
}

/* Wait on NBD until DONE says 1 (0) or -1 (-1), or the deadline
 * (-1, ETIMEDOUT).  DONE says 0 to go on waiting.
 */
static int
wait_for (struct nbd_handle *nbd, int64_t deadline,
          int (*done) (struct nbd_handle *, int64_t), int64_t arg)
{
  for (;;) {
    int d = done (nbd, arg);
    if (d)
      return d > 0 ? 0 : -1;
    if (nbd_aio_is_dead (nbd) || nbd_aio_is_closed (nbd)) {
      errno = ECONNRESET;
      return -1;
    }
    int64_t left = deadline - (int64_t) fsc_mono_ms ();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    if (nbd_poll (nbd, left > 1000 ? 1000 : (int) left) == -1) {
      errno = nbd_get_errno () ? nbd_get_errno () : EIO;
      return -1;
    }
  }
}

static int
negotiating (struct nbd_handle *nbd, int64_t unused)
{
  return nbd_aio_is_negotiating (nbd) || nbd_aio_is_ready (nbd);
}

static int
go_done (struct nbd_handle *nbd, int64_t unused)
{
  if (nbd_aio_is_ready (nbd))
    return 1;
  if (nbd_aio_is_negotiating (nbd)) {
    errno = EACCES;             /* the peer refused the export */
    return -1;
  }
  return 0;
}

/* TLS on NBD as configured: the fleet's pre-shared key, or this node's
 * certificate (ca-cert.pem, client-cert.pem, client-key.pem and
 * ca-crl.pem in the directory, as libnbd reads them) with the peer's
 * verified against the fleet's CA and its revocation list; or none.
 * libnbd 1.14 verifies a peer's certificate only when the URI has a
 * host name (TCP), not over a Unix socket.
 */
static int
set_tls (struct nbd_handle *nbd)
{
  if (cfg.psk_file)
    return nbd_set_tls (nbd, LIBNBD_TLS_REQUIRE) == -1 ||
      nbd_set_tls_psk_file (nbd, cfg.psk_file) == -1 ||
      nbd_set_tls_username (nbd, cfg.psk_user) == -1 ? -1 : 0;
  if (cfg.cert_dir)
    return nbd_set_tls (nbd, LIBNBD_TLS_REQUIRE) == -1 ||
      nbd_set_tls_certificates (nbd, cfg.cert_dir) == -1 ||
      nbd_set_tls_verify_peer (nbd, true) == -1 ? -1 : 0;
  return 0;
}

/* NBD connected to URI (opt mode, TLS as set) up to the options by
 * DEADLINE, a dial's and a probe's start: 0, or -1 with errno.
 */
static int
reach_options (struct nbd_handle *nbd, const char *uri, int64_t deadline)
{
  return nbd_set_opt_mode (nbd, true) == -1 || set_tls (nbd) == -1 ||
    nbd_aio_connect_uri (nbd, uri) == -1 ||
    wait_for (nbd, deadline, negotiating, 0) == -1 ? -1 : 0;
}

/* peerdial.h */
struct nbd_handle *
peer_dial (const char *export_name, const char *uri, int64_t deadline)
{
  struct nbd_handle *nbd = nbd_create ();
  if (nbd == NULL) {
    errno = nbd_get_errno () ? nbd_get_errno () : ENOMEM;
    return NULL;
  }
  if (reach_options (nbd, uri, deadline) == -1)
    goto fail;
  if (nbd_aio_is_negotiating (nbd) &&
      (nbd_set_export_name (nbd, export_name) == -1 ||
       nbd_aio_opt_go (nbd, NBD_NULL_COMPLETION) == -1 ||
       wait_for (nbd, deadline, go_done, 0) == -1))
    goto fail;
  if ((cfg.psk_file || cfg.cert_dir) && nbd_get_tls_negotiated (nbd) != 1) {
    errno = EPROTO;
    goto fail;
  }
  return nbd;
 fail:;
  int e = errno ? errno : EIO;
  nbdkit_debug ("fscache: peer %s: %s", uri, nbd_get_error ()
                ? nbd_get_error () : strerror (e));
  nbd_close (nbd);
  errno = e;
  return NULL;
}

/* peerdial.h */
bool
peer_dial_probe (const char *uri, int64_t deadline)
{
  struct nbd_handle *nbd = nbd_create ();
  if (nbd == NULL)
    return false;
  bool up = reach_options (nbd, uri, deadline) == 0 &&
    nbd_aio_is_negotiating (nbd);
  nbd_close (nbd);
  return up;
}
