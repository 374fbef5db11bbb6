/* zt_pref.c — preference losses on per-sequence log-probabilities (zt_pref.h). Each
 * formula is LLaMA-Factory 0.9.5's (train/dpo/trainer.py) or trl 0.24's (dpo_loss); the
 * derivative of each is written beside it. */
#include "zt_pref.h"

#include <math.h>
#include <stddef.h>

int zt_pref_uses_ref(zt_pref_loss_t loss) { return loss != ZT_PREF_ORPO && loss != ZT_PREF_SIMPO; }

/* ipo, orpo and simpo: LLaMA-Factory's concatenated_forward divides by the token count */
static int averages(zt_pref_loss_t loss) { return loss == ZT_PREF_IPO || loss == ZT_PREF_ORPO || loss == ZT_PREF_SIMPO; }

static const char *const metric_names[ZT_PREF_NMETRICS] = {
    "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
    "logps/rejected", "logits/chosen", "logits/rejected", "sft_loss", "odds_ratio_loss",
};

const char *zt_pref_metric_name(int i) { return i >= 0 && i < ZT_PREF_NMETRICS ? metric_names[i] : NULL; }

int zt_pref_nmetrics(zt_pref_loss_t loss) { return loss == ZT_PREF_ORPO ? ZT_PREF_NMETRICS : ZT_PREF_NMETRICS_BASE; }

/* torch's logsigmoid: min(x, 0) - log1p(exp(-|x|)), exact at both ends */
static double logsigmoid(double x) { return fmin(x, 0.0) - log1p(exp(-fabs(x))); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

/* One pair: its loss (the ftx term included), its rewards, and d loss / d (the policy's
 * logps as the loss sees them: sums or means). */
typedef struct {
    double loss, sft, rc, rr, dc, dr;
} pair_t;

static pair_t pair_loss(const zt_pref_cfg_t *cfg, double c, double r, double refc, double refr, double mean_c)
{
    const double beta = cfg->beta;
    pair_t p = {0};
    switch (cfg->loss) {
    case ZT_PREF_SIGMOID:
    case ZT_PREF_IPO:
    case ZT_PREF_HINGE: {
        /* trl dpo_loss, loss_type "sigmoid": z = beta ((c - r) - (refc - refr)),
         * -(1 - ls) logsigmoid(z) - ls logsigmoid(-z); dz: -(1 - ls) sigmoid(-z) + ls sigmoid(z) */
        const double ls = cfg->label_smoothing, z = beta * ((c - r) - (refc - refr));
        p.loss = -logsigmoid(z) * (1.0 - ls) - logsigmoid(-z) * ls;
        const double dz = -(1.0 - ls) * sigmoid(-z) + ls * sigmoid(z);
        p.dc = dz * beta;
        p.dr = -dz * beta;
        p.rc = beta * (c - refc);
        p.rr = beta * (r - refr);
        break;
    }
    case ZT_PREF_ORPO: {
        /* log_odds = (c - r) - (log1p(-e^c) - log1p(-e^r)); -c + beta (-logsigmoid(log_odds));
         * d log_odds / dc = 1 / (1 - e^c), / dr = -1 / (1 - e^r) */
        const double lo = (c - r) - (log1p(-exp(c)) - log1p(-exp(r)));
        p.loss = -c + beta * -logsigmoid(lo);
        const double dlo = -beta * sigmoid(-lo);
        p.dc = -1.0 + dlo / -expm1(c);
        p.dr = -dlo / -expm1(r);
        break;
    }
    case ZT_PREF_SIMPO: {
        /* -logsigmoid(beta ((c - r) - gamma / beta)) */
        const double z = beta * ((c - r) - cfg->simpo_gamma / beta);
        p.loss = -logsigmoid(z);
        const double dz = -sigmoid(-z);
        p.dc = dz * beta;
        p.dr = -dz * beta;
        break;
    }
    }
    if (!zt_pref_uses_ref(cfg->loss)) {
        p.rc = beta * c;
        p.rr = beta * r;
    }
    /* the SFT term: the chosen sequence's mean log-prob (LLaMA-Factory's chosen_logps_avg) */
    p.sft = -mean_c;
    if (cfg->ftx > 1e-6) p.loss += cfg->ftx * p.sft;
    return p;
}

double zt_pref_loss(const zt_pref_cfg_t *cfg, const zt_pref_batch_t *b, double *metrics, double *dchosen,
                    double *drejected)
{
    const int n = b->n, avg = averages(cfg->loss), ref = zt_pref_uses_ref(cfg->loss);
    double sum[ZT_PREF_NMETRICS] = {0}, loss = 0.0, lg[4] = {0};
    for (int i = 0; i < n; i++) {
        const double lc = b->len_chosen[i], lr = b->len_rejected[i];
        const double c = avg ? b->chosen[i] / lc : b->chosen[i], r = avg ? b->rejected[i] / lr : b->rejected[i];
        const double refc = ref ? (avg ? b->ref_chosen[i] / lc : b->ref_chosen[i]) : 0.0;
        const double refr = ref ? (avg ? b->ref_rejected[i] / lr : b->ref_rejected[i]) : 0.0;
        const pair_t p = pair_loss(cfg, c, r, refc, refr, b->chosen[i] / lc);
        loss += p.loss;
        /* d mean / d sum: 1/n, and 1/len where the loss read means; the ftx term's 1/lc */
        double dc = p.dc, dr = p.dr;
        if (avg) {
            dc /= lc;
            dr /= lr;
        }
        if (cfg->ftx > 1e-6) dc -= cfg->ftx / lc;
        if (dchosen) dchosen[i] = dc / n;
        if (drejected) drejected[i] = dr / n;
        sum[ZT_PREF_REWARDS_CHOSEN] += p.rc;
        sum[ZT_PREF_REWARDS_REJECTED] += p.rr;
        sum[ZT_PREF_REWARDS_ACCURACIES] += p.rc > p.rr;
        sum[ZT_PREF_REWARDS_MARGINS] += p.rc - p.rr;
        sum[ZT_PREF_LOGPS_CHOSEN] += c;
        sum[ZT_PREF_LOGPS_REJECTED] += r;
        sum[ZT_PREF_SFT_LOSS] += p.sft;
        sum[ZT_PREF_ODDS_RATIO_LOSS] += (p.loss - p.sft) / cfg->beta;
        if (b->logits_chosen) {
            lg[0] += b->logits_chosen[i];
            lg[1] += b->logits_count_chosen[i];
            lg[2] += b->logits_rejected[i];
            lg[3] += b->logits_count_rejected[i];
        }
    }
    if (metrics) {
        for (int k = 0; k < ZT_PREF_NMETRICS; k++) metrics[k] = n ? sum[k] / n : 0.0;
        metrics[ZT_PREF_LOGITS_CHOSEN] = lg[1] > 0 ? lg[0] / lg[1] : 0.0;
        metrics[ZT_PREF_LOGITS_REJECTED] = lg[3] > 0 ? lg[2] / lg[3] : 0.0;
        for (int k = zt_pref_nmetrics(cfg->loss); k < ZT_PREF_NMETRICS; k++) metrics[k] = 0.0;
    }
    return n ? loss / n : 0.0;
}
