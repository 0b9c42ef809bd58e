/* nbdkit-fscache-filter: dialling a fleet peer (peerdial.c). */
#ifndef FSC_PLUGIN_PEERDIAL_H
#define FSC_PLUGIN_PEERDIAL_H

#include <stdbool.h>
#include <stdint.h>

struct nbd_handle;

/* Once, before any dial: TLS with the pre-shared keys in PSK_FILE
 * presenting PSK_USER, or with this node's certificate in CERT_DIR
 * (the peer's verified), or neither (both NULL).  The strings must
 * outlive every dial.
 */
extern void peer_dial_configure (const char *psk_file, const char *psk_user,
                                 const char *cert_dir);

/* A new connection to URI for the export EXPORT_NAME, ready for reads
 * by DEADLINE (fsc_mono_ms), or NULL with errno (EACCES: the peer
 * refused the export; EPROTO: no TLS where it was required).
 */
extern struct nbd_handle *peer_dial (const char *export_name,
                                     const char *uri, int64_t deadline);

/* Does URI's NBD server get as far as the options by DEADLINE? */
extern bool peer_dial_probe (const char *uri, int64_t deadline);

#endif /* FSC_PLUGIN_PEERDIAL_H */
