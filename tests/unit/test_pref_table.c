/* test_pref_table.c — DPO's table of reference log-probs (zt_pref_table.h): a pair's first
 * values stay, completeness, and the file: values bit for bit through a save and a load,
 * the .tmp name gone, another record count refused naming the file, a missing file refused. */
#include "zt_pref_table.h"
#include "zt_test.h"

#include <stdio.h>
#include <unistd.h>

static void path_in_tmp(char *buf, size_t len, const char *name)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(buf, len, "%s/zt_pref_table_%d_%s", base, (int)getpid(), name);
}

static void test_put_get(void)
{
    zt_pref_table_t *t = zt_pref_table_create(3);
    double c = 1, r = 1;
    CU_ASSERT_EQUAL(zt_pref_table_get(t, 1, &c, &r), 0);
    CU_ASSERT_FALSE(zt_pref_table_complete(t));
    CU_ASSERT_EQUAL(zt_pref_table_put(t, 1, -12.5, -30.25), 1);
    /* the first computation stays: a later one of the same pair changes nothing */
    CU_ASSERT_EQUAL(zt_pref_table_put(t, 1, -1.0, -2.0), 0);
    CU_ASSERT_EQUAL(zt_pref_table_get(t, 1, &c, &r), 1);
    CU_ASSERT_EQUAL(c, -12.5);
    CU_ASSERT_EQUAL(r, -30.25);
    CU_ASSERT_EQUAL(zt_pref_table_put(t, 3, 0, 0), 0); /* out of range */
    CU_ASSERT_EQUAL(zt_pref_table_get(t, -1, &c, &r), 0);
    zt_pref_table_put(t, 0, -1, -2);
    CU_ASSERT_FALSE(zt_pref_table_complete(t));
    zt_pref_table_put(t, 2, -3, -4);
    CU_ASSERT_TRUE(zt_pref_table_complete(t));
    CU_ASSERT_EQUAL(t->filled, 3);
    zt_pref_table_free(t);
}

static void test_file(void)
{
    char path[512], tmp[600], err[512] = "";
    path_in_tmp(path, sizeof path, "a.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    zt_pref_table_t *t = zt_pref_table_create(5);
    /* values that need every bit of a double */
    zt_pref_table_put(t, 0, -0.1, -1.0 / 3.0);
    zt_pref_table_put(t, 3, -123456.789012345678, -2.0e-300);
    CU_ASSERT_EQUAL_FATAL(zt_pref_table_save(t, path, err, sizeof err), 0);
    CU_ASSERT_EQUAL(access(tmp, F_OK), -1);
    zt_pref_table_t *u = zt_pref_table_create(5);
    zt_pref_table_put(u, 4, -9, -9); /* replaced by the file's */
    CU_ASSERT_EQUAL_FATAL(zt_pref_table_load(u, path, err, sizeof err), 0);
    CU_ASSERT_EQUAL(u->filled, 2);
    double c, r;
    CU_ASSERT_EQUAL(zt_pref_table_get(u, 4, &c, &r), 0);
    CU_ASSERT_EQUAL(zt_pref_table_get(u, 1, &c, &r), 0);
    CU_ASSERT_EQUAL_FATAL(zt_pref_table_get(u, 0, &c, &r), 1);
    CU_ASSERT(c == -0.1 && r == -1.0 / 3.0);
    CU_ASSERT_EQUAL_FATAL(zt_pref_table_get(u, 3, &c, &r), 1);
    CU_ASSERT(c == -123456.789012345678 && r == -2.0e-300);
    /* another dataset's table: refused with the file's name */
    zt_pref_table_t *v = zt_pref_table_create(6);
    err[0] = 0;
    CU_ASSERT_EQUAL(zt_pref_table_load(v, path, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, path));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "5 pairs"));
    CU_ASSERT_EQUAL(v->filled, 0);
    remove(path);
    err[0] = 0;
    CU_ASSERT_EQUAL(zt_pref_table_load(v, path, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, path));
    zt_pref_table_free(t);
    zt_pref_table_free(u);
    zt_pref_table_free(v);
}

static const zt_test_t tests[] = {
    {"put_get", test_put_get},
    {"file", test_file},
    {NULL, NULL},
};

ZT_TEST_MAIN("pref_table", tests)
