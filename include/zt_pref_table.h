/* zt_pref_table.h — DPO's reference log-probabilities, each pair's computed once
 * (pref.precompute_ref_log_probs, TRL's precompute_ref_log_probs).
 *
 * The reference model is frozen, so a pair's reference log-prob sums (chosen, rejected:
 * all the loss and its metrics read of the reference) are the same every epoch. The table
 * holds them by the pair's record index in the training set (0 .. records - 1, the index
 * zt_data_sample_index gives, whatever the shuffle), filled the first time a pair is seen
 * and read from then on. It is a plain array: the train loop fills it on every rank alike
 * (the values the data ranks computed, shared each step), rank 0 saves it beside each
 * checkpoint and a resumed run loads it. The file is HDF5: /ref_chosen, /ref_rejected
 * (records, f64), /computed (records, u8), attribute records; written under a .tmp name,
 * synced and renamed, so a crash leaves the previous file whole. It knows no model and no
 * MPI. */
#ifndef ZT_PREF_TABLE_H
#define ZT_PREF_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct zt_pref_table {
    int64_t n;             /* records (pairs) of the training set */
    int64_t filled;        /* entries computed */
    double *ref;           /* (n, 2) chosen, rejected */
    unsigned char *have;   /* (n) 1 where computed */
} zt_pref_table_t;

/* An empty table of n records (n > 0); freed by zt_pref_table_free (NULL: nothing) */
zt_pref_table_t *zt_pref_table_create(int64_t n);
void zt_pref_table_free(zt_pref_table_t *t);

/* Record rec's sums into *chosen, *rejected: 1, or 0 where not computed (or out of range) */
int zt_pref_table_get(const zt_pref_table_t *t, int64_t rec, double *chosen, double *rejected);
/* Record rec's sums, unless it holds them already (the first computation stays): 1 where
 * added, 0 otherwise */
int zt_pref_table_put(zt_pref_table_t *t, int64_t rec, double chosen, double rejected);
/* Whether every record is computed */
int zt_pref_table_complete(const zt_pref_table_t *t);

/* The table into path (path.tmp first, synced, renamed): 0, or -1 with one line in err */
int zt_pref_table_save(const zt_pref_table_t *t, const char *path, char *err, size_t errlen);
/* path's table into t, which it replaces: 0, or -1 with one line in err naming the file (not
 * readable, not a table, or one of another record count: another dataset's) */
int zt_pref_table_load(zt_pref_table_t *t, const char *path, char *err, size_t errlen);

#endif
