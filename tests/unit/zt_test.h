/* zt_test.h — CUnit glue: each test program is a table of tests run as one suite.
 * Exit status is the verdict: non-zero when any assertion failed. */
#ifndef ZT_TEST_H
#define ZT_TEST_H

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *name; void (*fn)(void); } zt_test_t;

static inline int zt_test_run(const char *suite_name, const zt_test_t *tests)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite(suite_name, NULL, NULL);
    /* ZT_TEST_ONLY=NAME runs the tests whose names contain NAME (a developer's shortcut) */
    const char *only = getenv("ZT_TEST_ONLY");
    for (const zt_test_t *t = tests; t->name; t++)
        if (!only || strstr(t->name, only)) CU_add_test(s, t->name, t->fn);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    unsigned ran = CU_get_number_of_tests_run();
    CU_cleanup_registry();
    return (failed == 0 && ran > 0) ? 0 : 1;
}

/* Relative error |a-b| / max(|b|, floor). */
static inline double zt_relerr(double a, double b, double floor_)
{
    double d = fabs(a - b), m = fabs(b) > floor_ ? fabs(b) : floor_;
    return d / m;
}

#define ZT_TEST_MAIN(suite, table) \
    int main(void) { return zt_test_run(suite, table); }

#endif
