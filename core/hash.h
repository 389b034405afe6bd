/* Internal: xxHash for the hashes of bulk data (the delta codec's tree hash, the store's verified
 * blocks, the bench's read floor). Where the xxHash library exports its x86 dispatch, XXH3 calls
 * go through it: the library picks its AVX2 or AVX-512 code when the CPU has it, the same hashes
 * as the baseline SSE2 code, which Debian's build otherwise runs (an 8 KiB block in L1: 40
 * against 16 GB/s on one core of a 2-core VM with AVX2). */
#ifndef WSYNC_CORE_HASH_H
#define WSYNC_CORE_HASH_H

#define XXH_STATIC_LINKING_ONLY     /* XXH3_state_t on the stack: no allocation, no failure */
#include <xxhash.h>

#include "wsync_build_config.h"

#if WSYNC_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h>        /* XXH3_64bits and its update become the dispatching ones */
#endif

#endif
