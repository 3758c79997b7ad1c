/* test_dirlock.c - one writer per directory (common/dirlock.h, issue 38): whoever finds a
 * directory taken is told who holds it, in the holder's own words: another run of its kind, a
 * process of another kind, its own parent, itself; processes racing for a new directory see one
 * winner and every loser names the winner's PID (never "has not written its PID yet"); a lock
 * file left by an ended process is taken over. Processes are forked; every wait is on a pipe. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dirlock.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/cephalo-test-lock-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

static void lock_path(char *out, size_t n) { snprintf(out, n, "%s/" DIRLOCK_FILE, dir); }

static void read_line(int fd, char *buf, size_t n) {
    size_t k = 0;
    while (k + 1 < n && read(fd, buf + k, 1) == 1 && buf[k] != '\n') k++;
    buf[k] = '\0';
}

static void assert_has(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("'%s' lacks '%s'", text, needle);
}

static void test_same_process(void **state) {
    (void)state;
    err_t e = {{0}};
    int fd = dir_lock(dir, "cephalo run", &e);
    assert_true(fd >= 0);
    assert_int_equal(dir_lock(dir, "cephalo run", &e), -1);
    assert_has(e.msg, "is locked already by this cephalo run");
    dir_unlock(fd);
    fd = dir_lock(dir, "cephalo run", &e);
    assert_true(fd >= 0);
    dir_unlock(fd);
}

/* A training started by the process that holds the directory (checkpoint.dir = the run directory):
 * its parent is named as such, not as "another training". */
static void test_parent_holds(void **state) {
    (void)state;
    err_t e = {{0}};
    int fd = dir_lock(dir, "cephalo run", &e), p[2];
    assert_true(fd >= 0);
    assert_int_equal(pipe(p), 0);
    pid_t c = fork();
    if (c == 0) {
        err_t ce = {{0}};
        int rc = dir_lock(dir, "training", &ce);
        dprintf(p[1], "%d %s\n", rc, ce.msg);
        _exit(0);
    }
    close(p[1]);
    char line[1024], want[256];
    read_line(p[0], line, sizeof line);
    waitpid(c, NULL, 0);
    close(p[0]);
    snprintf(want, sizeof want, "-1 %s is in use by the cephalo run that started this training (PID %ld", dir, (long)getpid());
    assert_has(line, want);
    assert_has(line, "give this training another directory");
    dir_unlock(fd);
}

/* A child holds the lock (as `self`, or with a raw line when self is NULL) until the parent closes
 * `release`; returns its PID once it holds it. */
static pid_t hold_in_child(const char *self, const char *raw, int release[2]) {
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(release), 0);
    pid_t c = fork();
    if (c == 0) {
        close(release[1]);
        err_t e;
        if (self) {
            if (dir_lock(dir, self, &e) < 0) _exit(1);
        } else {
            char path[128];
            lock_path(path, sizeof path);
            int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
            if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(fd, raw, strlen(raw)) != (ssize_t)strlen(raw)) _exit(1);
        }
        (void)!write(ready[1], "x", 1);
        char b;
        (void)!read(release[0], &b, 1); /* until the parent closes it */
        _exit(0);
    }
    close(ready[1]);
    close(release[0]);
    char b;
    assert_int_equal(read(ready[0], &b, 1), 1);
    close(ready[0]);
    return c;
}

static void release_child(pid_t c, int release[2]) {
    close(release[1]);
    int st;
    waitpid(c, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_holder_words(void **state) {
    (void)state;
    int rel[2];
    err_t e = {{0}};
    char want[160];
    pid_t c = hold_in_child("training", NULL, rel);
    assert_int_equal(dir_lock(dir, "cephalo run", &e), -1);
    snprintf(want, sizeof want, "is in use by a training (PID %ld on host ", (long)c);
    assert_has(e.msg, want);
    assert_has(e.msg, "wait for it to end, stop it, or use another directory");
    assert_int_equal(dir_lock(dir, "training", &e), -1);
    snprintf(want, sizeof want, "is in use by another training (PID %ld", (long)c);
    assert_has(e.msg, want);
    /* the probe says the same and creates nothing */
    err_t p = {{0}};
    assert_int_equal(dir_lock_held(dir, "cephalo run", &p), 1);
    snprintf(want, sizeof want, "is in use by a training (PID %ld", (long)c);
    assert_has(p.msg, want);
    release_child(c, rel);
    assert_int_equal(dir_lock_held(dir, "cephalo run", &p), 0);
    /* the ended holder's file is taken over, its line replaced */
    int fd = dir_lock(dir, "cephalo run", &e);
    assert_true(fd >= 0);
    char path[128], line[256];
    lock_path(path, sizeof path);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    snprintf(want, sizeof want, "pid %ld host ", (long)getpid());
    assert_has(line, want);
    assert_has(line, " (cephalo run)\n");
    dir_unlock(fd);
}

/* A file of an older release ("pid P host H"), and one whose holder never wrote: named as well
 * as can be (the second after waiting for a line that does not come). */
static void test_other_writers(void **state) {
    (void)state;
    int rel[2];
    err_t e = {{0}};
    pid_t c = hold_in_child(NULL, "pid 4711 host node-a\n", rel);
    assert_int_equal(dir_lock(dir, "cephalo run", &e), -1);
    assert_has(e.msg, "is in use by another process (PID 4711 on host node-a");
    release_child(c, rel);
    c = hold_in_child(NULL, "", rel);
    assert_int_equal(dir_lock(dir, "cephalo run", &e), -1);
    assert_has(e.msg, "is in use by another process, which has not written who it is in the lock file");
    release_child(c, rel);
    assert_int_equal(dir_lock_held(dir, "cephalo run", &e), 0);
}

/* Processes racing for a new directory: one wins, every loser names it (the winner's line is in
 * the file from the moment the lock can be seen). */
static void test_race(void **state) {
    (void)state;
    enum { ROUNDS = 20, RACERS = 6 };
    for (int round = 0; round < ROUNDS; round++) {
        char sub[96];
        snprintf(sub, sizeof sub, "%s/r%d", dir, round);
        assert_int_equal(mkdir(sub, 0755), 0);
        int go[2], out[2], hold[2];
        assert_int_equal(pipe(go), 0);
        assert_int_equal(pipe(out), 0);
        assert_int_equal(pipe(hold), 0);
        pid_t kids[RACERS];
        for (int k = 0; k < RACERS; k++) {
            if ((kids[k] = fork()) != 0) continue;
            close(go[1]), close(out[0]), close(hold[1]);
            char b;
            (void)!read(go[0], &b, 1); /* all start together: when the parent closes go */
            err_t e = {{0}};
            int fd = dir_lock(sub, "cephalo run", &e);
            if (fd >= 0) dprintf(out[1], "W %ld\n", (long)getpid());
            else dprintf(out[1], "L %s\n", e.msg);
            (void)!read(hold[0], &b, 1); /* the winner holds on until every racer has reported */
            _exit(0);
        }
        close(go[0]), close(out[1]), close(hold[0]);
        close(go[1]);
        char lines[RACERS][1024];
        long winner = -1;
        int wins = 0;
        for (int k = 0; k < RACERS; k++) {
            read_line(out[0], lines[k], sizeof lines[k]);
            if (lines[k][0] == 'W') wins++, winner = atol(lines[k] + 2);
        }
        close(hold[1]);
        for (int k = 0; k < RACERS; k++) waitpid(kids[k], NULL, 0);
        close(out[0]);
        assert_int_equal(wins, 1);
        char want[160];
        snprintf(want, sizeof want, "is in use by another cephalo run (PID %ld on host ", winner);
        for (int k = 0; k < RACERS; k++)
            if (lines[k][0] == 'L') assert_has(lines[k], want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parent_holds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_holder_words, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_writers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_race, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
