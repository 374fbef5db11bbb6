/* zt_train.h — the training loop: one SPMD loop identical on every rank.
 *
 * It wires the modules together: data -> model (unit by unit, with parameters
 * the shard engine materializes) -> gradient reduction -> optimizer -> logs and
 * checkpoints. Every decision that depends on one rank's state (a data error,
 * a NaN, a signal) is agreed collectively before anyone acts on it. */
#ifndef ZT_TRAIN_H
#define ZT_TRAIN_H

#include "zt_comm.h"
#include "zt_config.h"

/* Runs training as configured on comm's mesh, made from plan (zt_train_plan). Returns a
 * ZT_EXIT_* code, identical on every rank. */
int zt_train(const zt_config_t *cfg, const zt_parallel_plan_t *plan, zt_comm_t *comm);

/* The plan of cfg on `world` ranks, `per_node` of them on each node (0: the nodes
 * differ), for the model cfg describes: 0, or -1 with one line in err. */
int zt_train_plan(const zt_config_t *cfg, int world, int per_node, zt_parallel_plan_t *plan, char *err,
                  size_t errlen);

/* --estimate-memory: per-rank estimates for every strategy at world size `world`
 * with `per_node` ranks per node (rank 0 prints); under parallel.strategy = auto, of the mesh
 * zt_train_auto_mesh would take there, with its line. */
void zt_train_estimate_memory(const zt_config_t *cfg, int world, int per_node);
/* parallel.strategy = auto with none of parallel.pipeline_parallel_size,
 * tensor_parallel_size and sequence_parallel_size given: when no strategy fits a rank's
 * memory at tp 1 x sp 1, the mesh (tp within a node, Ulysses sp) and strategy that fit with
 * the least traffic per step (the engine's bytes plus the activations' formulas); when none
 * fits without a pipeline, the smallest pipeline size that fits, with the same search inside
 * it, under 1f1b (gpipe where the accumulation steps are fewer than pp; a
 * parallel.pp_schedule given is kept). Sets cfg's pp, tp, sp (and pp_schedule) and returns
 * 1 with the reason in why; 0 leaves cfg alone (it fits as it is, or nothing fits: the
 * run's own check says so); -1 with one line in why where the only pipeline that fits needs
 * another schedule than the one given. Pure arithmetic on this rank's limit (zt_run.c
 * gives every rank rank 0's answer). */
int zt_train_auto_mesh(zt_config_t *cfg, int world, int per_node, char *why, size_t len);

#endif
