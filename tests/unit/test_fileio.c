/* test_fileio.c - the one output helper (common/fileio.h file_out_*) and the files a command
 * reads (file_guard_*, filled by common/outputs.c out_check), issue 38: what an existing output
 * path is decides how it is written (a file atomically or as a stream, a symbolic link followed,
 * a character device or a FIFO in place, a block device, a socket or a directory refused, never
 * replaced), and no output is ever a file the command reads, by device and inode, when it is
 * opened after out_check said so. Every case in a temporary directory; device nodes only as root
 * (mknod), never the real /dev/null. */
#define _XOPEN_SOURCE 700 /* mknod, symlink, link */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/outputs.h"
#include "common/strutil.h"
#include "state/dump.h"

static char dir[256];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "%s/cephalo-fileio-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    file_guard_clear();
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    file_guard_clear();
    return system(cmd) == 0 ? 0 : -1;
}

static const char *in_dir(const char *name, char *buf) {
    snprintf(buf, 512, "%s/%s", dir, name);
    return buf;
}

static void write_text(const char *path, const char *text) {
    err_t err;
    if (file_write_atomic(path, text, strlen(text), 0, &err) < 0) fail_msg("%s", err.msg);
}

static char *read_text(const char *path) {
    size_t len;
    err_t err;
    char *t = file_read_all(path, 1 << 20, &len, &err);
    if (!t) fail_msg("%s", err.msg);
    return t;
}

static void assert_text(const char *path, const char *want) {
    char *t = read_text(path);
    assert_string_equal(t, want);
    free(t);
}

/* Opening path with flags fails, and the message holds needle. */
static void assert_refused(const char *path, int flags, const char *needle) {
    file_out o;
    err_t err;
    assert_int_equal(file_out_open(&o, path, flags, &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("'%s' lacks '%s'", err.msg, needle);
}

static void test_atomic_replaces_whole_and_keeps_mode(void **state) {
    (void)state;
    char p[512];
    in_dir("f.txt", p);
    write_text(p, "old");
    chmod(p, 0600);
    file_out o;
    err_t err;
    assert_int_equal(file_out_open(&o, p, FILE_OUT_ATOMIC, &err), 0);
    assert_int_equal(file_write_all(o.fd, "new", 3), 0);
    assert_text(p, "old"); /* nothing seen before the rename */
    assert_int_equal(file_out_close(&o, &err), 0);
    assert_text(p, "new");
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* abort: the old file stays, no temporary is left */
    assert_int_equal(file_out_open(&o, p, FILE_OUT_ATOMIC, &err), 0);
    file_out_abort(&o);
    assert_text(p, "new");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_streams_truncate_or_append(void **state) {
    (void)state;
    char p[512];
    in_dir("log", p);
    write_text(p, "line1\n");
    file_out o;
    err_t err;
    assert_int_equal(file_out_open(&o, p, FILE_OUT_APPEND, &err), 0);
    fputs("line2\n", file_out_file(&o));
    assert_int_equal(file_out_close(&o, &err), 0);
    assert_text(p, "line1\nline2\n");
    assert_int_equal(file_out_open(&o, p, FILE_OUT_STREAM, &err), 0);
    fputs("fresh\n", file_out_file(&o));
    assert_int_equal(file_out_close(&o, &err), 0);
    assert_text(p, "fresh\n");
}

static void test_symbolic_links_followed(void **state) {
    (void)state;
    char target[512], link[512], dangling[512];
    write_text(in_dir("target", target), "old");
    assert_int_equal(symlink("target", in_dir("link", link)), 0);
    write_text(link, "new");
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode)); /* the link stays, its target is written */
    assert_text(target, "new");
    assert_int_equal(symlink("nowhere", in_dir("dangling", dangling)), 0);
    assert_refused(dangling, FILE_OUT_ATOMIC, "a symbolic link to a file that does not exist");
    assert_int_equal(lstat(dangling, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
}

static void test_directory_socket_refused(void **state) {
    (void)state;
    char d[512], s[512];
    assert_int_equal(mkdir(in_dir("sub", d), 0700), 0);
    assert_refused(d, FILE_OUT_ATOMIC, "is a directory, expected a file");
    err_t err;
    assert_int_equal(file_out_check(d, &err), -1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    in_dir("sock", s);
    assert_true(strlen(s) < sizeof a.sun_path);
    memcpy(a.sun_path, s, strlen(s) + 1);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_refused(s, FILE_OUT_STREAM, "is a socket");
    assert_refused(s, FILE_OUT_ATOMIC, "is a socket");
    close(fd);
    struct stat st;
    assert_int_equal(lstat(s, &st), 0);
    assert_true(S_ISSOCK(st.st_mode)); /* never renamed over */
}

static void test_fifo_in_place_or_refused(void **state) {
    (void)state;
    char p[512];
    assert_int_equal(mkfifo(in_dir("fifo", p), 0600), 0);
    /* no reader: refused at once, not waited on */
    assert_refused(p, FILE_OUT_ATOMIC, "a FIFO that no process reads");
    assert_refused(p, FILE_OUT_STREAM, "a FIFO that no process reads");
    int rd = open(p, O_RDONLY | O_NONBLOCK);
    assert_true(rd >= 0);
    file_out o;
    err_t err;
    assert_int_equal(file_out_open(&o, p, FILE_OUT_ATOMIC, &err), 0);
    assert_int_equal(file_write_all(o.fd, "through", 7), 0);
    assert_int_equal(file_out_close(&o, &err), 0);
    char buf[16] = {0};
    assert_int_equal(read(rd, buf, sizeof buf), 7);
    assert_string_equal(buf, "through");
    close(rd);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    /* a command's own state is never written into one */
    rd = open(p, O_RDONLY | O_NONBLOCK);
    assert_refused(p, FILE_OUT_ATOMIC | FILE_OUT_OWN, "is a FIFO, not a regular file");
    close(rd);
    assert_int_equal(file_state_exists(p, &err), -1);
    /* and read as an input, a FIFO nobody writes is empty at once, not a wait */
    size_t len = 99;
    char *t = file_read_all(p, 1 << 20, &len, &err);
    assert_non_null(t);
    assert_int_equal(len, 0);
    free(t);
}

static void test_devices_as_root(void **state) {
    (void)state;
    if (geteuid() != 0) skip();
    char nul[512], blk[512];
    assert_int_equal(mknod(in_dir("null", nul), S_IFCHR | 0666, makedev(1, 3)), 0);
    write_text(nul, "discarded"); /* in place: /dev/null's driver */
    struct stat st;
    assert_int_equal(lstat(nul, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    /* no driver behind major 240 (local use): even a wrong open could not touch a disk */
    assert_int_equal(mknod(in_dir("blk", blk), S_IFBLK | 0600, makedev(240, 0)), 0);
    assert_refused(blk, FILE_OUT_ATOMIC, "is a block device");
    assert_refused(blk, FILE_OUT_APPEND, "is a block device");
    assert_int_equal(lstat(blk, &st), 0);
    assert_true(S_ISBLK(st.st_mode));
}

static void test_guard_by_inode_after_out_check(void **state) {
    (void)state;
    char data[512], shard[512], hard[512], other[512];
    assert_int_equal(mkdir(in_dir("d", data), 0700), 0);
    write_text(in_dir("d/train_000000.bin", shard), "tokens");
    out_set s = out_begin("test");
    char pattern[600];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", data);
    out_input(&s, "--data", pattern);
    err_t err;
    assert_int_equal(out_check(&s, &err), 0);
    out_free(&s);
    /* a hard link made after the check, as when a path is swapped between check and open */
    assert_int_equal(link(shard, in_dir("hard.log", hard)), 0);
    assert_refused(hard, FILE_OUT_STREAM, "this is train_000000.bin, an input of --data");
    assert_text(shard, "tokens");
    /* the command's own state is exempt (it replaces what it read, atomically) */
    assert_int_equal(file_write_atomic(hard, "x", 1, FILE_OUT_OWN, &err), 0);
    assert_text(shard, "tokens");
    /* an inode the input freed and a new file reused is not the input */
    assert_int_equal(unlink(shard), 0);
    write_text(in_dir("other", other), "mine");
    assert_int_equal(file_write_atomic(other, "ok", 2, 0, &err), 0);
}

/* out_check resolves what does not exist yet by its longest existing part: a log in a dump
 * directory not made yet, spelled with ".." */
static void test_paths_not_there_yet(void **state) {
    (void)state;
    char dd[512], log[600];
    in_dir("dd", dd);
    snprintf(log, sizeof log, "%s/x/../dd/init.safetensors", dir);
    out_set s = out_begin("test");
    out_file(&s, "--log", log);
    out_dir(&s, "--dump", dd, &dump_dir_kind);
    err_t err;
    assert_int_equal(out_check(&s, &err), -1);
    assert_non_null(strstr(err.msg, "init.safetensors is a file this command keeps in its dump directory"));
    out_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_atomic_replaces_whole_and_keeps_mode, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_streams_truncate_or_append, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_symbolic_links_followed, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_directory_socket_refused, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_fifo_in_place_or_refused, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_devices_as_root, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_guard_by_inode_after_out_check, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_paths_not_there_yet, make_dir, remove_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
