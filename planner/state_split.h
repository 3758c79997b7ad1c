/* state_split.h - how the training state is divided among ranks.
 *
 * The planner first decides how many parameters each rank holds (balanced, or water-filled to
 * minimise the largest memory utilisation), then cuts every FSDP unit into per-rank contiguous
 * ranges so that as few units as possible are unevenly sharded. */
#ifndef CEPHALO_STATE_SPLIT_H
#define CEPHALO_STATE_SPLIT_H

#include <stdint.h>

/* Balanced shard of a unit: numel/n, the first numel%n ranks one more. */
int64_t split_balanced(int64_t numel, int n, int rank);

/* Parameters per rank minimising max_i (compute_i + bytes_per_param*p_i) / capacity_i, with
 * p_i <= room_i and sum p_i = total. Returns 0, or -1 when sum room_i < total. */
int split_waterfill(int n, const double *capacity, const int64_t *compute, const int64_t *room,
                    int bytes_per_param, int64_t total, int64_t *p);

/* Shard sizes shards[u*n + i] with sum_u shards[u*n+i] = p[i] and sum_i = numel[u]: units are
 * balanced except the fewest (largest first) needed to meet the per-rank totals, which are
 * filled rank by rank. Returns the number of units whose shards are not balanced. */
int split_shards(int n_units, const int64_t *numel, int n, const int64_t *p, int64_t *shards);

/* 1 when a unit's shard sizes differ by more than one element. */
int split_is_uneven(const int64_t *sizes, int n);

#endif
