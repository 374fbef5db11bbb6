/* zt_pref.h — preference losses (DPO and its relatives) on per-sequence log-probabilities,
 * as LLaMA-Factory 0.9.5's CustomDPOTrainer (with trl 0.24) computes them.
 *
 * The model gives each sequence's summed log-probability of its response tokens and their
 * count; this module turns a micro-batch of n pairs (chosen, rejected) into the loss, the
 * metrics LLaMA-Factory logs, and dL/d(each sequence's log-prob sum): the weight by which
 * the backward scales that sequence's token cross-entropy gradients (d logp / d logits is
 * minus the cross-entropy's). It knows no model and no MPI.
 *
 * What LLaMA-Factory 0.9.5 computes, read from its code and checked by the fixture
 * (tests/reference/make_pref_fixtures.py runs the trainer's own get_batch_loss_metrics):
 * - ipo, orpo and simpo use each sequence's mean log-prob (sum / response tokens), the
 *   reference's too; sigmoid and hinge the sums;
 * - sigmoid, ipo and hinge all go through trl 0.24's dpo_loss, which LLaMA-Factory calls
 *   without its loss_type argument, so all three are the sigmoid loss (with label
 *   smoothing): hinge on sums is sigmoid, ipo is sigmoid on means. ztrain computes the
 *   same, so that a LLaMA-Factory YAML trains the same model;
 * - orpo: -mean_c + beta * -logsigmoid(log odds ratio); simpo: -logsigmoid(beta (mean_c -
 *   mean_r) - gamma); both without a reference, their rewards beta * the policy's means;
 * - pref_ftx > 1e-6 adds ftx * (-mean_c) to every pair's loss (the mean over the chosen
 *   sequence's tokens whatever the loss);
 * - the micro-batch's loss is the mean over its pairs; the metrics are means over its
 *   pairs; the logits metrics the mean of every logit of the chosen (rejected) rows. */
#ifndef ZT_PREF_H
#define ZT_PREF_H

typedef enum { ZT_PREF_SIGMOID = 0, ZT_PREF_IPO, ZT_PREF_HINGE, ZT_PREF_ORPO, ZT_PREF_SIMPO } zt_pref_loss_t;

/* pref.* of the configuration, LLaMA-Factory's names and defaults in brackets */
typedef struct zt_pref_cfg {
    zt_pref_loss_t loss;    /* pref_loss (sigmoid) */
    double beta;            /* pref_beta (0.1) */
    double ftx;             /* pref_ftx (0) */
    double label_smoothing; /* dpo_label_smoothing (0; sigmoid only) */
    double simpo_gamma;     /* simpo_gamma (0.5) */
} zt_pref_cfg_t;

/* Whether the loss needs a reference model's log-probs (not orpo, simpo). */
int zt_pref_uses_ref(zt_pref_loss_t loss);

/* The metrics, in the order of zt_pref_metric_name; orpo logs all ZT_PREF_NMETRICS, the
 * others the first ZT_PREF_NMETRICS_BASE. */
enum {
    ZT_PREF_REWARDS_CHOSEN = 0, ZT_PREF_REWARDS_REJECTED, ZT_PREF_REWARDS_ACCURACIES, ZT_PREF_REWARDS_MARGINS,
    ZT_PREF_LOGPS_CHOSEN, ZT_PREF_LOGPS_REJECTED, ZT_PREF_LOGITS_CHOSEN, ZT_PREF_LOGITS_REJECTED,
    ZT_PREF_NMETRICS_BASE,
    ZT_PREF_SFT_LOSS = ZT_PREF_NMETRICS_BASE, ZT_PREF_ODDS_RATIO_LOSS,
    ZT_PREF_NMETRICS
};
/* LLaMA-Factory's name of metric i ("rewards/chosen") */
const char *zt_pref_metric_name(int i);
/* How many metrics the loss logs */
int zt_pref_nmetrics(zt_pref_loss_t loss);

/* One micro-batch of n pairs; index i is pair i. Sums are over response tokens. */
typedef struct zt_pref_batch {
    int n;
    const double *chosen, *rejected;         /* (n) policy log-prob sums */
    const double *ref_chosen, *ref_rejected; /* (n) reference's, NULL where !zt_pref_uses_ref */
    const double *len_chosen, *len_rejected; /* (n) response tokens (> 0) */
    /* (n) sum of every logit of the sequence's rows and their count (positions x
     * vocabulary), for the logits metrics; NULL: those metrics 0 */
    const double *logits_chosen, *logits_rejected, *logits_count_chosen, *logits_count_rejected;
} zt_pref_batch_t;

/* The mean loss over the pairs; metrics (ZT_PREF_NMETRICS, those beyond the loss's count
 * 0); dchosen, drejected (n): d loss / d (each policy log-prob sum), either may be NULL. */
double zt_pref_loss(const zt_pref_cfg_t *cfg, const zt_pref_batch_t *b, double *metrics, double *dchosen,
                    double *drejected);

#endif
