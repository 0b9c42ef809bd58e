/* libfscache: XXH3 at the speed the CPU allows.
 *
 * Every byte served from the cache is hashed (fscache-verify), so the
 * hash's speed is the hit path's.  libxxhash's XXH3_64bits is built
 * for the baseline x86-64 (SSE2): about 4 GB/s on the benchmark
 * machine, a quarter of a millisecond per MiB.  Its runtime-dispatched
 * variant (xxh_x86dispatch.h) picks AVX2 or AVX-512 when the CPU has
 * them, 40 GB/s and more there, and gives the same values: including
 * the header replaces XXH3_64bits with it.  Where the library lacks it
 * (another architecture), the plain function is used.
 */
#ifndef FSC_XXH_H
#define FSC_XXH_H

#include <xxhash.h>

#if defined HAVE_XXH_X86DISPATCH_H && defined HAVE_XXH3_64BITS_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#endif /* FSC_XXH_H */
