/* data_cmd.h - `cephalo data` (docs/data.md, docs/tokenizer.md). */
#ifndef CEPHALO_DATA_CMD_H
#define CEPHALO_DATA_CMD_H

/* argv[0] is "data"; returns the exit status. */
int data_main(int argc, char **argv);

#endif
