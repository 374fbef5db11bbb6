#include "zt_test.h"
static void t_placeholder(void) { CU_ASSERT(1); }
static const zt_test_t tests[] = {{"placeholder", t_placeholder}, {NULL, NULL}};
ZT_TEST_MAIN("test_config", tests)
