/* Whether this build and machine have a transport, for tests that skip what they cannot run. */
#ifndef WSYNC_TEST_TRANSPORTS_H
#define WSYNC_TEST_TRANSPORTS_H

/* 1 when transport `name` (ucx, ofi, tcp, ...) is compiled in and usable here; otherwise 0,
 * after printing "skipped: transport NAME: why" to stderr. */
int test_have_transport(const char *name);

#endif
