#include "zt_test.h"
static void t_none(void) { CU_ASSERT(1); }
static const zt_test_t tests[] = {{"none", t_none}, {NULL, NULL}};
ZT_TEST_MAIN("sft", tests)
