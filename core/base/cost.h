/* libfscache: what fills cost the clients, measured (cost.c): windows
 * with fills and without, compared.  The ground floor: a state machine
 * fed with the time and two counters, so that tests/unit/unit-cost.c
 * drives it with a simulated stream.
 */
#ifndef FSC_COST_H
#define FSC_COST_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* A probe's length: the settling and the measured window in the
 * other mode (cost.c).
 */
#define FSC_COST_SETTLE_NS ((uint64_t) 100 * 1000 * 1000)
#define FSC_COST_WINDOW_NS ((uint64_t) 200 * 1000 * 1000)
#define FSC_COST_PROBE_NS (FSC_COST_SETTLE_NS + FSC_COST_WINDOW_NS)

struct fsc_cost {
  pthread_mutex_t lock;
  bool enabled;                 /* fsc_cost_init's ON */
  /* Read without the lock (relaxed atomics): */
  uint64_t next_ns;             /* nothing to do before this ... */
  uint64_t next_served;         /* ... unless served reaches this */
  bool bare;                    /* the mode now: fills off */
  bool costly;                  /* the verdict */
  uint64_t ratio_pm;            /* the last sample: served per second
                                 * without fills over with, per mille;
                                 * 0 until one */
  uint64_t samples, changes;    /* valid comparisons; verdict changes */
  /* Under the lock: */
  int phase;                    /* COST_* in cost.c */
  uint64_t phase_ns;            /* when the phase began */
  uint64_t cycle_ns;            /* the verdict's stretch, now */
  uint64_t w_ns, w_served, w_busy_us; /* the window measured: marks at
                                       * its start; w_ns 0: none */
  uint64_t normal_rate;         /* the stretch's last window, bytes/s;
                                 * 0: not valid */
  bool normal_big;              /* ... it carried WINDOW_BYTES */
  uint64_t last_pm[4];          /* the last samples (COST_N), a ring */
  unsigned ring;                /* where the next one goes */
  unsigned nlast;               /* samples in it since the stream began,
                                 * up to COST_N */
  bool guessed;                 /* the stream's guess taken */
};

/* ON false: fsc_cost_step never leaves the fill mode. */
extern void fsc_cost_init (struct fsc_cost *k, bool on);
extern void fsc_cost_destroy (struct fsc_cost *k);

/* At NOW (monotonic ns), with SERVED bytes served to clients so far
 * and BUSY_US microseconds of upstream reads in flight so far (both
 * running totals), advance the windows.  PRIOR: the rates' guess that
 * fills cost the clients, taken at a stream's first window that
 * counts.  Returns whether fills are off now: the verdict's mode, or
 * the other one during a probe.  Cheap before k->next_ns: one atomic
 * load.
 */
extern bool fsc_cost_step (struct fsc_cost *k, uint64_t now,
                           uint64_t served, uint64_t busy_us,
                           bool prior);

#endif /* FSC_COST_H */
