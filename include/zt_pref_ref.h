/* zt_pref_ref.h — the DPO reference pass with each pair's prompt computed once.
 *
 * A preference micro-batch holds pairs as rows 2i (chosen) and 2i + 1 (rejected) of Tf
 * positions; both rows of a pair start with the same prompt (LLaMA-Factory's pairwise
 * processor: prompt + chosen response, prompt + rejected response, the same prompt ids).
 * The reference pass is forward only, and a causal model's hidden state at a position
 * depends on the tokens up to it alone, so the rejected row's prompt positions hold what
 * the chosen row's hold: they need no computing of their own. Nor do the positions after
 * a row's last loss-bearing one (padding: no earlier position sees them). This module
 * turns the micro-batch into a compact batch of the positions that need computing and the
 * maps zt_model_set_shared_rows takes, so that the per-token work (every linear, norm and
 * the MLP, most of a forward) runs on the compact tokens and each attention on the full
 * rows, each query seeing the keys and values it sees there. Every token then gets what
 * the full batch gives it, to fp32 rounding: the same operations on the same numbers, but
 * a GEMM's row rounds by how many rows the call runs (OpenBLAS picks its kernels by the
 * shape), so the sums are not the full pass's bit for bit, and a policy equal to its
 * reference (fresh adapters, step 1; its pass runs every position) is ln 2 to rounding.
 * Hence pref.share_prompt, false by default. It knows no model and no MPI. */
#ifndef ZT_PREF_REF_H
#define ZT_PREF_REF_H

#include <stdint.h>

typedef struct zt_pref_share {
    int B, T;            /* the compact batch: B rows of T (B T >= n, the rest filler) */
    int n;               /* compact tokens that stand for a full position */
    int32_t *inp, *tgt;  /* (B T) their ids and targets (filler: id 0, target -1) */
    int32_t *pos;        /* (B T) their positions in their rows (filler: 0) */
    int32_t *own;        /* (B T) their full positions (b Tf + t; filler: 0) */
    int32_t *row;        /* (B T) their full rows (filler: -1) */
    int32_t *full;       /* (Bf Tf) each full position's compact token; -1: none (zeros) */
} zt_pref_share_t;

/* The compact batch of the micro-batch's rows inp, tgt (Bf, Tf; Bf even: pairs): the chosen
 * row's positions up to its last loss-bearing one, and the rejected row's from the end of
 * the prefix it shares with the chosen row (the same ids, no loss in either, computed by
 * the chosen row) up to its last loss-bearing one. Its arrays are freed by
 * zt_pref_share_free. */
void zt_pref_share_make(zt_pref_share_t *s, const int32_t *inp, const int32_t *tgt, int Bf, int Tf);
void zt_pref_share_free(zt_pref_share_t *s);

/* The full rows' sums (Bf) of minus the compact tokens' losses (B T), each row's in the
 * order of its positions as a sum over the full row adds them (a position not computed
 * carries no loss: its zero changes no sum). */
void zt_pref_share_sums(const zt_pref_share_t *s, const float *losses, int Bf, double *sum);

#endif
