#include "tests/support/check.h"

int check_failures;
static int cases_passed, cases_failed;

void check_run(const char *name, void (*fn)(void))
{
    check_failures = 0;
    fprintf(stderr, "-- %s\n", name);
    fn();
    if (check_failures == 0) {
        cases_passed++;
        fprintf(stderr, "ok   %s\n", name);
    } else {
        cases_failed++;
        fprintf(stderr, "FAIL %s (%d checks failed)\n", name, check_failures);
    }
}

int check_summary(void)
{
    printf("%d passed, %d failed\n", cases_passed, cases_failed);
    return cases_failed == 0 && cases_passed > 0 ? 0 : 1;
}
