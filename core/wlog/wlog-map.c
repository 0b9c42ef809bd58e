/* libfscache: the write log's extent map (wlog.c has the overview).
 *
 * In memory only: which record holds the newest logged version of
 * each byte of the export, as disjoint extents in a treap ordered by
 * start (random priorities from wl->prng), so that a lookup, an insert
 * that cuts what was there and a retire's removal stay logarithmic
 * whatever the order of the writes.  Records enter the log's map
 * strictly in sequence order (step 3 of a record's life, atop wlog.c),
 * so it always shows what recovery would find; they leave it when the
 * writer retires them (step 5).  The writer builds private maps of its
 * batches with the same functions.
 *
 * A file of its own because it is a data structure with no I/O, no
 * locks of its own (the caller holds wl->lock for the log's map) and
 * no calls back into the log.  Inserting an append's record cannot
 * fail (its nodes are allocated with the record, wl_entry.spare); only
 * wl_map_insert and wl_map_try_insert allocate.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "wlog-int.h"

static uint32_t
next_prio (uint32_t *s)
{
  /* xorshift32: priorities only need to look random. */
  uint32_t x = *s ? *s : 2463534242u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

/* Nodes starting before KEY into *L, the others into *R. */
static void
split (struct wl_ext *t, uint64_t key, struct wl_ext **l, struct wl_ext **r)
{
  if (t == NULL) {
    *l = *r = NULL;
    return;
  }
  if (t->start < key) {
    split (t->r, key, &t->r, r);
    *l = t;
  }
  else {
    split (t->l, key, l, &t->l);
    *r = t;
  }
}

static struct wl_ext *
merge (struct wl_ext *l, struct wl_ext *r)
{
  if (l == NULL)
    return r;
  if (r == NULL)
    return l;
  if (l->prio > r->prio) {
    l->r = merge (l->r, r);
    return l;
  }
  r->l = merge (l, r->l);
  return r;
}

void
wl_map_free (struct wl_ext *t)
{
  if (t == NULL)
    return;
  wl_map_free (t->l);
  wl_map_free (t->r);
  free (t);
}

/* Make [START, END) map to E in *ROOT, cutting what was there, with
 * the nodes X (the new extent) and REST (the tail of an extent the
 * range splits; freed if not needed), both allocated by the caller: it
 * cannot fail, so the map is never left half changed.  Caller holds
 * wl->lock if ROOT is the log's map.
 */
void
wl_map_insert_nodes (struct fsc_wlog *wl, struct wl_ext **root,
                     uint64_t start, uint64_t end, struct wl_entry *e,
                     struct wl_ext *x, struct wl_ext *rest)
{
  struct wl_ext *l, *m, *r;
  bool need_rest = false;
  split (*root, start, &l, &r);
  /* The last extent before START may reach into the range, or past it.
   * (Then nothing starts inside the range: one REST is enough.)
   */
  struct wl_ext *last = l;
  while (last && last->r)
    last = last->r;
  if (last && last->end > start) {
    if (last->end > end) {
      need_rest = true;
      *rest = (struct wl_ext) { .start = end, .end = last->end,
                                .e = last->e };
    }
    last->end = start;
  }
  split (r, end, &m, &r);
  /* Extents starting inside the range: all covered but maybe the last. */
  struct wl_ext *mlast = m;
  while (mlast && mlast->r)
    mlast = mlast->r;
  if (mlast && mlast->end > end) {
    need_rest = true;
    *rest = (struct wl_ext) { .start = end, .end = mlast->end,
                              .e = mlast->e };
  }
  wl_map_free (m);
  *x = (struct wl_ext) { .start = start, .end = end, .e = e };
  x->prio = next_prio (&wl->prng);
  if (need_rest)
    rest->prio = next_prio (&wl->prng);
  else {
    free (rest);
    rest = NULL;
  }
  *root = merge (merge (l, x), merge (rest, r));
}

/* Make [START, END) map to E in *ROOT.  Only allocation can fail: then
 * the map is left as it was, and wl_map_try_insert returns -1 (ENOMEM)
 * while wl_map_insert marks the log failed (its callers check
 * wl->failed).  Appends never get here: their nodes are
 * allocated with the record (wl_entry.spare), so a record that was
 * written always enters the map.
 */
int
wl_map_try_insert (struct fsc_wlog *wl, struct wl_ext **root,
                   uint64_t start, uint64_t end, struct wl_entry *e)
{
  struct wl_ext *x = malloc (sizeof *x);
  struct wl_ext *rest = malloc (sizeof *rest);
  if (x == NULL || rest == NULL) {
    free (x);
    free (rest);
    errno = ENOMEM;
    return -1;
  }
  wl_map_insert_nodes (wl, root, start, end, e, x, rest);
  return 0;
}

void
wl_map_insert (struct fsc_wlog *wl, struct wl_ext **root, uint64_t start,
               uint64_t end, struct wl_entry *e)
{
  if (wl_map_try_insert (wl, root, start, end, e) == -1) {
    wl->failed = true;
    wl->err = ENOMEM;
  }
}

void
wl_map_visit (const struct wl_ext *t, uint64_t a, uint64_t b,
              wl_visit_fn *fn, void *opaque)
{
  if (t == NULL)
    return;
  if (a < t->start)
    wl_map_visit (t->l, a, b, fn, opaque);
  if (t->start < b && t->end > a)
    fn (opaque, t);
  if (b > t->end)
    wl_map_visit (t->r, a, b, fn, opaque);
}

/* T without its nodes that map to E (freed), as a treap: merging the
 * two subtrees of a removed node keeps the order and the heap.
 */
static struct wl_ext *
prune (struct wl_ext *t, const struct wl_entry *e)
{
  if (t == NULL)
    return NULL;
  t->l = prune (t->l, e);
  t->r = prune (t->r, e);
  if (t->e != e)
    return t;
  struct wl_ext *rest = merge (t->l, t->r);
  free (t);
  return rest;
}

/* Remove the extents in E's range that still map to E (the rest of
 * the range belongs to newer records).  It allocates nothing, so it
 * cannot fail: a retired record never stays in the map.
 */
void
wl_map_remove_entry (struct wl_ext **root, const struct wl_entry *e)
{
  struct wl_ext *l, *m, *r;
  split (*root, e->off, &l, &r);
  split (r, e->off + e->len, &m, &r);
  *root = merge (merge (l, prune (m, e)), r);
}

void
wl_collect (void *opaque, const struct wl_ext *x)
{
  struct wl_segs *s = opaque;
  if (s->n == s->cap) {
    size_t ncap = s->cap ? 2 * s->cap : 16;
    struct wl_seg *v = realloc (s->v, ncap * sizeof *v);
    if (v == NULL) {
      s->nomem = true;
      return;
    }
    s->v = v;
    s->cap = ncap;
  }
  s->v[s->n++] = (struct wl_seg) { x->start, x->end, x->e };
}
