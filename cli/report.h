/* report.h - `cephalo report RUN_DIR [-o FILE]` (docs/report.md): one self-contained HTML page of
 * a run directory (plan.json and the ranks' rank-R.jsonl logs): the loss curves, samples/s per
 * rank, measured against predicted step time and peak memory, and the plan table. Inline SVG and
 * CSS only: no script, no external URL. */
#ifndef CEPHALO_REPORT_H
#define CEPHALO_REPORT_H

/* argv[0] is "report"; returns the exit status (0, or 2 for a bad or incomplete run directory). */
int report_main(int argc, char **argv);

#endif
