/* wprofile.h - the worker's side of `cephalo profile` (docs/profile.md).
 *
 *   cephalo-worker profile --model M [--seq T] [--precision fp32|bf16|fp16] [--device cpu|cuda]
 *                          [--threads N] [--memory SIZE] [--max-micro K] --name DEVICE -o FILE
 *   cephalo-worker profile-comm [--min-bytes N] [--max-bytes N] -o FILE   (RANK, WORLD_SIZE, ...)
 *
 * `profile` times the engine's own unit code (wm_unit_forward/backward, wm_head_step) for the
 * embedding, one transformer block and the head at microbatch 1..K, exactly as a training step
 * runs them (the unit-boundary copies to and from the offload pool included), and measures the
 * compute memory the engine allocates for each microbatch with the device's own allocator; an
 * out-of-memory at some microbatch ends the sweep. `profile-comm` times allgatherv and
 * reduce-scatterv over the job's ranks at message sizes from min to max bytes, with even shards
 * and with rank 0 holding twice the others' share. Both write a profile file (planner/profile.h)
 * that `cephalo profile` merges. */
#ifndef CEPHALO_WORKER_WPROFILE_H
#define CEPHALO_WORKER_WPROFILE_H

int worker_profile(int argc, char **argv);
int worker_profile_comm(int argc, char **argv);

#endif
