/* nbdkit-fscache-filter: a fleet's members from the name system
 * (memberdns.c).
 */
#ifndef FSC_PLUGIN_MEMBERDNS_H
#define FSC_PLUGIN_MEMBERDNS_H

/* SPEC is fscache-peers' "dns:NAME:PORT" (NAME's addresses on PORT) or
 * "dns:NAME" (NAME's SRV records).  The members as the text of a peers
 * file (nbd://ADDRESS:PORT lines, sorted, each once; the caller frees
 * it), or NULL with errno: ENOENT if NAME has no such records,
 * EBADMSG for a malformed DNS answer.
 */
extern char *member_dns_text (const char *spec);

#endif /* FSC_PLUGIN_MEMBERDNS_H */
