/* version.h - the release this binary was built from: the VERSION file, with `git describe` of the
 * source tree appended for development builds (docs/development.md, "Versions").
 *
 *   cephalo_version()   "0.1.0" (a release: built without git) or "0.1.0+g1a2b3c4d5e6f[.dirty]"
 *   cephalo_release()   "0.1.0": the release alone, what must agree between operator and workers
 *   cephalo_commit()    "1a2b3c4d5e6f[-dirty]", or "unknown" without git */
#ifndef CEPHALO_VERSION_H
#define CEPHALO_VERSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

const char *cephalo_version(void);
const char *cephalo_release(void);
const char *cephalo_commit(void);

/* The environment variable the operator passes its version in to the worker pods it starts. */
#define CEPHALO_ENV_OPERATOR_VERSION "CEPHALO_OPERATOR_VERSION"
/* 0 when CEPHALO_ENV_OPERATOR_VERSION is unset or names this binary's release; else -1 with a
 * message naming both versions in msg (a worker of another release than its operator's would
 * misread the plan and the flags it is given). */
int cephalo_check_operator_version(const char *self, char *msg, size_t n);

/* Whether two version strings name the same release (their parts before '+' or '-' are equal):
 * a development build of 0.1.0 works with the 0.1.0 release, not with 0.2.0. */
bool cephalo_same_release(const char *a, const char *b);

/* "NAME VERSION (commit C)\n" into out: what --version prints. */
void cephalo_version_line(const char *name, char *out, size_t n);

/* `NAME version [--json]` and `NAME --version [--json]` (argv[0] is "version" or "--version"):
 * the version line on stdout, or with --json one object {"name", "version", "release", "commit"};
 * --help says so, and any other argument is refused (exit 2) rather than ignored. Returns the
 * exit status. */
int cephalo_version_cmd(const char *name, int argc, char **argv);

#define CEPHALO_BUILD_INFO_HELP "The release and commit this binary was built from (always 1)."
/* The Prometheus family cephalo_build_info (a gauge of 1 labelled with the version, the commit and
 * the component: "operator", "worker") with its HELP and TYPE lines, into f. */
void cephalo_build_info_metric(FILE *f, const char *component);

#endif
