/* test_progress.c - the operator's reading of worker /metrics (operator/progress.c): the text a
 * real worker renders (worker/metrics.c), labels with braces and quotes in them, malformed and
 * non-finite samples skipped, and a scrape over HTTP from a scripted server (200, 500, refused). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "cmd/metrics.h"
#include "fake_http.h"
#include "operator/progress.h"

static void test_worker_text(void **state) {
    (void)state;
    metrics_info info = {.job = "j", .rank = 0, .device = "L4", .batch = 4, .tokens_per_sample = 8};
    metrics *m = metrics_new(&info);
    worker_progress p = {0};
    size_t len;
    char *t = metrics_render(m, &len);
    assert_int_equal(progress_parse(t, len, &p), 0); /* no step yet: nothing made up */
    free(t);
    metrics_step s = {.step_s = 0.5, .loss = 3.25, .step = 41, .samples = 4};
    metrics_record(m, &s);
    metrics_checkpoint(m, 40);
    t = metrics_render(m, &len);
    memset(&p, 0, sizeof p);
    assert_int_equal(progress_parse(t, len, &p), 4);
    assert_true(p.have_step && p.have_ckpt && p.have_loss && p.have_rate);
    assert_true(p.step == 41 && p.ckpt_step == 40 && p.loss == 3.25 && p.samples_per_s == 8);
    free(t);
    metrics_free(m);
}

static void test_odd_lines(void **state) {
    (void)state;
    const char *text =
        "# HELP cephalo_train_step x\n"
        "cephalo_train_steps_total{job=\"a\"} 99\n"            /* a longer name: not the step */
        "cephalo_train_step{job=\"we}ird \\\" } x\",rank=\"0\"} 17 1700000000000\n"
        "cephalo_train_loss{job=\"a\"} NaN\n"                   /* not finite: skipped */
        "cephalo_checkpoint_step{job=\"a\"} 1x\n"               /* not a number: skipped */
        "cephalo_train_samples_per_second 2.5"; /* no labels, no final newline */
    worker_progress p = {0};
    assert_int_equal(progress_parse(text, strlen(text), &p), 2);
    assert_true(p.have_step && p.step == 17);
    assert_false(p.have_loss || p.have_ckpt);
    assert_true(p.have_rate && p.samples_per_s == 2.5);
    memset(&p, 0, sizeof p);
    const char *cut = "cephalo_train_step{job=\"a\"";
    assert_int_equal(progress_parse(cut, strlen(cut), &p), 0);
}

static void test_scrape(void **state) {
    (void)state;
    const fake_step steps[] = {
        {"GET", "/metrics", 200, "cephalo_train_step{rank=\"0\"} 5\ncephalo_train_loss{rank=\"0\"} 1.5\n", 0, false},
        {"GET", "/metrics", 500, "boom", 0, false},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, steps, 2), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", srv.port);
    worker_progress p = {0};
    err_t err;
    assert_int_equal(progress_scrape(url, 2.0, &p, &err), 0);
    assert_true(p.have_step && p.step == 5 && p.have_loss && p.loss == 1.5);
    assert_int_equal(progress_scrape(url, 2.0, &p, &err), -1);
    assert_non_null(strstr(err.msg, "HTTP 500"));
    assert_int_equal(fake_join(&srv), 2);
    /* the server is gone: refused, with the URL named */
    assert_int_equal(progress_scrape(url, 1.0, &p, &err), -1);
    assert_non_null(strstr(err.msg, url));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_text),
        cmocka_unit_test(test_odd_lines),
        cmocka_unit_test(test_scrape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
