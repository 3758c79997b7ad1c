/* launch.h - starting `cephalo-worker` processes on this machine, for `cephalo run`'s gang and
 * `cephalo profile`'s measuring runs alike: where the worker is, a free rendezvous port, a rank's
 * environment (this process's, less what the rank is told: common/worker_cmd.h's wcmd_env), and
 * the start itself (its own process group, stdin from nowhere, output to a log, gone when the
 * launcher dies).
 *
 *   wcmd_argv env = {0};
 *   wcmd_env e;
 *   wcmd_env_init(&e, rank, world, "127.0.0.1", port);
 *   launch_env(&e, NULL, &env);
 *   pid_t pid = launch_spawn(argv.v, env.v, log_fd, pgid, &err);   // pgid 0: a group of its own
 *   int status = launch_wait(pid);                                   // 0, the exit code, 128+N */
#ifndef CEPHALO_LAUNCH_H
#define CEPHALO_LAUNCH_H

#include <stdbool.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/worker_cmd.h"

#define PATH_LEN 4096

/* The worker binary into out[PATH_LEN]: $CEPHALO_WORKER, else cephalo-worker next to this
 * program, or cephalo-worker-cuda when gpu (some device of the job is a GPU). */
int launch_find_worker(char *out, bool gpu, err_t *err);
/* A port nobody listens on now on 127.0.0.1: bind port 0 and read what the kernel chose. Rank 0
 * binds it again moments later; another program could take it in between, and rank 0's error
 * would say so. */
int launch_free_port(err_t *err);
/* This process's environment less the variables e sets (a rank must not inherit another RANK),
 * then e's entries, then extra ("NAME=VALUE", NULL-terminated; NULL: none): appended to *out. */
void launch_env(const wcmd_env *e, char *const extra[], wcmd_argv *out);
/* Starts argv[0] with envp, in process group pgid (0: a new group, the child's own), stdin from
 * /dev/null, stdout and stderr to out_fd (-1: this process's). On Linux the child is killed when
 * the launcher dies, even by SIGKILL. The pid, or -1 with err set. */
pid_t launch_spawn(char *const argv[], char *const envp[], int out_fd, pid_t pgid, err_t *err);
/* Waits for pid: its exit status, 128 + N when killed by signal N, or -1 (errno) when it is not
 * a child of this process. */
int launch_wait(pid_t pid);

/* A group of ranks run to their end (cephalo profile): cmd fills rank r's arguments and
 * environment, all start, all are waited for. 0 when every rank exits 0; else the first failed
 * rank (lowest) in *failed and its status in *status, and 1; -1 with err set when one cannot be
 * started (those started are still waited for). */
typedef void (*launch_cmd_fn)(void *ctx, int rank, wcmd_argv *argv, wcmd_argv *env);
int launch_ranks(int world, launch_cmd_fn cmd, void *ctx, int *failed, int *status, err_t *err);

#endif
