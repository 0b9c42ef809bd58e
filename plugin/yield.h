/* nbdkit-fscache-filter: a worker that has served requests back to
 * back without sleeping offers its CPU (yield.c).
 */
#ifndef FSCACHE_YIELD_H
#define FSCACHE_YIELD_H

#include <stdbool.h>
#include <stdint.h>

/* The budget in microseconds (fscache-worker-yield); 0: never. */
extern void yield_set_budget_us (uint64_t us);

/* After a client's request is served, on its worker thread: yields if
 * the thread has run a budget without sleeping.  Returns whether it
 * did.
 */
extern bool yield_after_request (void);

/* On the thread that reads the upstream (upstream.c), for each read:
 * the request it serves did the plugin's work, not the cache's, and
 * starts a new budget (yield.c, "The upstream's work").
 */
extern void yield_note_upstream (void);

#endif /* FSCACHE_YIELD_H */
