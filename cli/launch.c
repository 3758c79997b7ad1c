/* launch.c - starting worker processes on this machine (launch.h). */
#include "cli/launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "common/env.h"
#include "common/log.h"
#include "common/strutil.h"

extern char **environ;

int launch_find_worker(char *out, bool gpu, err_t *err) {
    const char *env;
    if (env_text("CEPHALO_WORKER", &env, err) < 0) return -1;
    if (env) {
        if (str_fmt(out, PATH_LEN, err, "$CEPHALO_WORKER", "%s", env) < 0) return -1;
    } else {
        char self[PATH_LEN];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return err_set(err, "cannot find this program's directory (/proc/self/exe); set $CEPHALO_WORKER");
        self[n] = '\0';
        *strrchr(self, '/') = '\0';
        if (str_fmt(out, PATH_LEN, err, "the worker's path", "%s/cephalo-worker%s", self, gpu ? "-cuda" : "") < 0) return -1;
    }
    if (access(out, X_OK) != 0) return err_set(err, "%s: cannot execute the worker: %s (set $CEPHALO_WORKER)", out, strerror(errno));
    return 0;
}

int launch_free_port(err_t *err) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    int e = errno;
    if (fd >= 0) close(fd);
    return ok ? ntohs(a.sin_port) : err_set(err, "cannot find a free TCP port on 127.0.0.1: %s", strerror(e));
}

/* Whether "NAME=..." entry sets a name that one of vars ("NAME=VALUE") sets too. */
static bool set_by(const char *entry, const wcmd_argv *vars) {
    const char *eq = strchr(entry, '=');
    size_t n = eq ? (size_t)(eq - entry) + 1 : strlen(entry);
    for (int i = 0; i < vars->n; i++)
        if (!strncmp(entry, vars->v[i], n)) return true;
    return false;
}

void launch_env(const wcmd_env *e, char *const extra[], wcmd_argv *out) {
    wcmd_argv ours = {0};
    wcmd_env_entries(e, &ours);
    for (int i = 0; extra && extra[i]; i++) wcmd_argv_add(&ours, "%s", extra[i]);
    for (char **v = environ; *v; v++)
        if (!set_by(*v, &ours)) wcmd_argv_add(out, "%s", *v);
    for (int i = 0; i < ours.n; i++) wcmd_argv_add(out, "%s", ours.v[i]);
    wcmd_argv_free(&ours);
}

/* In the child: into the group, output redirected, then the program. */
static void exec_child(char *const argv[], char *const envp[], int out_fd, pid_t pgid, pid_t parent) __attribute__((noreturn));
static void exec_child(char *const argv[], char *const envp[], int out_fd, pid_t pgid, pid_t parent) {
    setpgid(0, pgid);
#ifdef __linux__
    /* if the launcher is killed outright (SIGKILL: no chance to stop the gang), the workers go too */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
#else
    (void)parent;
#endif
    int in = open("/dev/null", O_RDONLY);
    if (in > 0) dup2(in, 0), close(in);
    if (out_fd >= 0) dup2(out_fd, 1), dup2(out_fd, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the mask survives exec; the handlers do not */
    execve(argv[0], argv, envp);
    dprintf(2, "cannot execute %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

pid_t launch_spawn(char *const argv[], char *const envp[], int out_fd, pid_t pgid, err_t *err) {
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) exec_child(argv, envp, out_fd, pgid, parent);
    if (pid < 0) return err_set(err, "cannot start %s: fork: %s", argv[0], strerror(errno));
    /* both sides set the group, so it is set before either the child execs or we signal it */
    setpgid(pid, pgid ? pgid : pid);
    return pid;
}

int launch_wait(pid_t pid) {
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int launch_ranks(int world, launch_cmd_fn cmd, void *ctx, int *failed, int *status, err_t *err) {
    pid_t *pids = xcalloc((size_t)world, sizeof *pids), pgid = 0;
    int rc = 0;
    *failed = -1, *status = 0;
    for (int r = 0; r < world && !rc; r++) {
        wcmd_argv argv = {0}, env = {0};
        cmd(ctx, r, &argv, &env);
        pids[r] = launch_spawn(argv.v, env.v, -1, pgid, err);
        if (pids[r] < 0) rc = -1;
        else if (!pgid) pgid = pids[r];
        wcmd_argv_free(&argv);
        wcmd_argv_free(&env);
    }
    for (int r = 0; r < world; r++) {
        if (pids[r] <= 0) continue;
        int st = launch_wait(pids[r]);
        if (st && *failed < 0) *failed = r, *status = st;
    }
    free(pids);
    return rc < 0 ? -1 : *failed >= 0;
}
