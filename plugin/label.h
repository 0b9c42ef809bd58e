/* nbdkit-fscache-filter: what an object caches, in words (label.c). */
#ifndef FSC_PLUGIN_LABEL_H
#define FSC_PLUGIN_LABEL_H

/* A plugin parameter, as nbdkit passes it on (not ours). */
extern void label_config (const char *key, const char *value);

/* EXPORTNAME's label: the plugin, the parameters that name the image
 * (no secrets) and the export, or fscache-key's value; malloc'd, NULL
 * if out of memory.
 */
extern char *label_of (const char *exportname);

extern void label_free (void);

#endif /* FSC_PLUGIN_LABEL_H */
