/*
 * CTXS__INVARIANT(id, cond): invariant id holds here. The invariants are
 * numbered where they are relied on (C1.. in store/commit.c, R1.. in
 * store/runway.c, W1.. in store/background.c, P1.. in
 * index/check_file_pages.c; docs/ARCHITECTURE.md lists them) and checked where they must hold, in
 * debug builds and in the test build of the library (CTXS_TEST_HOOKS,
 * src/meson.build), which the test suites link: a broken one aborts,
 * naming it. In a release build, which defines NDEBUG (the project's
 * default buildtype is release, with b_ndebug=if-release: meson.build),
 * it is nothing: cond is not evaluated.
 */
#ifndef CTXS_INVARIANT_H
#define CTXS_INVARIANT_H

#if !defined(NDEBUG) || defined(CTXS_TEST_HOOKS)
#include <stdio.h>
#include <stdlib.h>

#define CTXS__INVARIANT(id, cond)                                                                  \
    ((cond) ? (void)0                                                                              \
            : (fprintf(stderr, "ctxstore: invariant %s broken at %s:%d: %s\n", id, __FILE__,       \
                       __LINE__, #cond),                                                           \
               abort()))
#else
#define CTXS__INVARIANT(id, cond) ((void)sizeof((cond) ? 1 : 0))
#endif

#endif
