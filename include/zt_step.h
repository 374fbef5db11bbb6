/* zt_step.h — one optimizer step as a schedule: per pipeline rank, a list of actions.
 *
 * A step runs the gradient-accumulation micro-batches (0 .. M-1) through the model's
 * stages (0 .. S-1, contiguous ranges of units from the embedding to the head) and then
 * reduces the gradients and steps the optimizer. Which rank runs what, and in what order,
 * is data: a list of actions per rank of the pipeline axis (pp ranks),
 *   F m s   forward of micro-batch m through stage s
 *   B m s   its backward (the last stage's includes the head's forward and backward,
 *           which the model runs as one chunked pass)
 *   SA/RA   send / receive the activation leaving stage s (to stage s + 1)
 *   SG/RG   send / receive the gradient entering stage s (to stage s - 1)
 *   R       the step's end: gradient reduction, clipping, optimizer
 * and, in a schedule with a reference (DPO under a pipeline, zt_schedule_add_reference),
 *   FR m s  the reference's forward of micro-batch m through stage s (forward only: its
 *           last stage's head gives the micro-batch's reference log-probabilities)
 *   SR/RR   send / receive the reference's activation leaving stage s (to stage s + 1)
 * so the train loop interprets a list, and tests print and check the lists without
 * running a model (torch.distributed.pipelining's _Action lists, DeepSpeed's
 * TrainSchedule). Stage s lives on pipeline rank s mod pp: v = S / pp stages per rank,
 * looped (rank r holds stages r, r + pp, ..., Megatron's interleaving).
 *
 * Schedules (M micro-batches, S = pp v stages):
 *   gpipe             every forward, then every backward (all M micro-batches' activations
 *                     live on every stage at once)
 *   1f1b              pp - 1 - r warm-up forwards, then one forward, one backward, ...
 *                     (at most pp micro-batches in flight on rank 0, pp - r on rank r)
 *   interleaved_1f1b  1F1B over v looped stages per rank (Megatron's order: groups of pp
 *                     micro-batches per stage); M must be a multiple of pp
 * At pp = 1 every schedule is the one-stage step: F m, B m for each m, then R (one
 * micro-batch's activations at a time), the step ztrain ran before pipelines.
 *
 * Sends are non-blocking and receives block, so a schedule must never wait for a message
 * that no rank will send before it: zt_schedule_check simulates the lists and says so. */
#ifndef ZT_STEP_H
#define ZT_STEP_H

#include <stddef.h>

#include "zt_plan.h"

typedef enum {
    ZT_ACT_FWD = 0, ZT_ACT_BWD, ZT_ACT_SEND_ACT, ZT_ACT_RECV_ACT, ZT_ACT_SEND_GRAD, ZT_ACT_RECV_GRAD, ZT_ACT_REDUCE,
    ZT_ACT_REF_FWD, ZT_ACT_SEND_REF, ZT_ACT_RECV_REF,
    ZT_ACT_N
} zt_action_kind_t;

typedef struct zt_action {
    zt_action_kind_t kind;
    int micro;  /* m (-1 for R) */
    int stage;  /* the stage whose compute it is, or whose boundary the message crosses:
                 * SA/RA carry stage s's output to s + 1 (stage = s for SA, s + 1 for RA);
                 * SG/RG carry stage s's input gradient to s - 1 (stage = s for SG, s - 1 for RG);
                 * SR/RR as SA/RA */
    int peer;   /* send/receive: the other pipeline rank (-1 otherwise) */
} zt_action_t;

typedef struct zt_schedule {
    zt_pp_schedule_t kind;
    int pp, v, stages, micro;
    int ref;            /* the lists hold the reference's forwards (zt_schedule_add_reference) */
    int head_split;     /* the last stage's F runs the head's forward and loss, its B the head's
                         * backward (zt_model_train_head_forward), holding the micro-batch's
                         * dlogits between them; otherwise its B runs the whole head */
    int *n;             /* (pp) actions per rank */
    zt_action_t **a;    /* (pp) each rank's list */
    int **post;         /* (pp) per action: a message's batch, the action it is issued before
                         * (zt_schedule_plan_in_order); NULL: unplanned */
} zt_schedule_t;

/* The schedule `kind` over pp ranks of v stages each for `micro` micro-batches: 0, or -1
 * with one line in err (v > 1 only for interleaved_1f1b, which needs micro a multiple of
 * pp; micro >= 1). Free with zt_schedule_free. */
int zt_schedule_build(zt_schedule_t *s, zt_pp_schedule_t kind, int pp, int v, int micro, char *err, size_t errlen);
void zt_schedule_free(zt_schedule_t *s);

/* DPO under a pipeline: the reference's forward of each micro-batch through each stage as
 * actions of the schedule, so its messages travel while the ranks compute and its bubble is
 * the schedule's, not a pipeline fill and drain of its own. On every rank, just before the
 * policy's forward of m on stage s (before its receive RA), RR m s (s > 0), FR m s and SR m s
 * (s < S - 1): the reference's input arrives before the policy's, its output leaves before the
 * policy's, so a list that cannot deadlock keeps that property (the pair FR, F is one forward
 * with two messages each way), and the reference's log-probabilities of m exist on the last
 * stage before its backward, where the loss needs them. A micro-batch's slot is taken at its
 * first action, now RR or FR, no earlier than before (no forward sits between them), so the
 * slots a rank needs do not change. pp 1: nothing (the one-stage step runs the reference
 * inside its forward action). */
void zt_schedule_add_reference(zt_schedule_t *s);

/* The sends and receives in rank `rank`'s list (each has a buffer of its own in a step) */
int zt_schedule_messages(const zt_schedule_t *s, int rank);

/* The pipeline rank that runs stage `stage` */
static inline int zt_schedule_stage_rank(const zt_schedule_t *s, int stage) { return stage % s->pp; }

/* A message's tag: unique per (direction, micro-batch, stage boundary) within a step; the
 * reference's activations are a third direction */
int zt_schedule_tag(const zt_schedule_t *s, const zt_action_t *a);

/* An action as text ("F3.1": forward of micro-batch 3 on stage 1; "SA3.1>1": its
 * activation sent to rank 1; "R"); the characters written. */
int zt_action_format(const zt_action_t *a, char *buf, size_t len);
/* A rank's list as text, actions separated by spaces (truncated to len) */
void zt_schedule_format(const zt_schedule_t *s, int rank, char *buf, size_t len);

/* The model slots rank `rank` needs: a micro-batch takes a slot (its activations) from its
 * first action on the rank to its last backward there, the lowest one free; slot (micro)
 * gets each micro-batch's. Returns the slots used: 1 for the one-stage step, pp - rank at
 * most under 1F1B, every micro-batch under GPipe. */
int zt_schedule_slots(const zt_schedule_t *s, int rank, int *slot);

/* Checks a schedule by running the lists: each rank in turn does its next action unless
 * it is a receive whose message has not been sent; fails when no rank can move before
 * every list ends (a deadlock), or when a message is sent twice, never received, or
 * received without a send; also that every stage runs F and B of every micro-batch once,
 * F before B, and every rank ends with R; with a reference, FR once before F on every stage. inflight (pp) or NULL: the most micro-batches
 * each rank held between a forward and its backward (summed over its stages). 0, or -1
 * with the first fault in err. */
int zt_schedule_check(const zt_schedule_t *s, int *inflight, char *err, size_t errlen);

/* Whether a is a send (SA, SG, SR) */
int zt_action_is_send(const zt_action_t *a);

/* Stream-ordered messages (NCCL; zt_p2p_in_order): a rank's sends and receives run in
 * issue order on one stream, a pair of ranks' messages in one direction match in issue
 * order (no tags), and an operation completes only once its partner is posted, so a
 * receive posted early holds back every send after it, and a send holds back everything
 * after it until its receive is posted. Such a backend issues the messages that sit
 * between two compute actions of a list as one batch (zt_p2p_batch: one NCCL group, whose
 * operations progress together), there, and waits for the whole batch before the next
 * compute, as Megatron's batch_isend_irecv. Where that alone would deadlock (a rank's
 * send whose receive the peer posts only after a message that rank sends later: the
 * interleaved schedule's deeper warm-up, the reference's extra messages), the receive
 * moves into the batch the peer is waiting in, as Megatron's send_forward_recv_forward
 * posts the next receive with a send. zt_schedule_plan_in_order works that out (s->post,
 * the same on every rank); a received message still reaches the model at its own
 * action, from its buffer. 0, or -1 with one line in err (a list no batching saves). */
int zt_schedule_plan_in_order(zt_schedule_t *s, char *err, size_t errlen);

/* Rank `rank`'s messages in issue order (by s->post, then list order; list order where
 * unplanned) into order (zt_schedule_messages entries, action indices); the count. */
int zt_schedule_issue_order(const zt_schedule_t *s, int rank, int *order);

/* The batches rank `rank` issues as planned; *moved (or NULL): its receives issued in an
 * earlier batch than the one between their computes */
int zt_schedule_batches(const zt_schedule_t *s, int rank, int *moved);

/* Checks that the lists, issued as planned (or, unplanned, each message in the batch
 * between its computes), run under those semantics: each rank's batches and computes in
 * list order, a batch complete only when the partner of each of its operations is posted
 * (its batch reached) on the other rank, the k-th message issued from one rank to another
 * being the other's k-th receive issued from it, which must be the same message. 0, or -1
 * with the first fault in err (a deadlock names the batch each stuck rank waits in).
 * Complements zt_schedule_check, which checks the lists' data flow under MPI's tags. */
int zt_schedule_check_in_order(const zt_schedule_t *s, char *err, size_t errlen);

#endif
