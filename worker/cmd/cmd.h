/* cmd.h - cephalo-worker's subcommands (worker/cmd/): main.c dispatches argv[1] to one of these,
 * each of which parses its own options (common/args.h) and returns the process's exit status
 * (common/worker_cmd.h: 0 done, 1 runtime failure, 2 bad input, 143 stopped on request). argv[0]
 * is the subcommand's name. */
#ifndef CEPHALO_CMD_H
#define CEPHALO_CMD_H

#define WORKER_NAME "cephalo-worker"

/* --device's values, for args_choice */
extern const char *const cmd_devices[];

int cmd_train(int argc, char **argv);        /* train.c: one rank of a training job */
int cmd_eval(int argc, char **argv);         /* eval.c: the validation loss of a model */
int cmd_sample(int argc, char **argv);       /* sample.c: text from a model (docs/sample.md) */
int cmd_export(int argc, char **argv);       /* export.c: a checkpoint as a Hugging Face directory */
int cmd_profile(int argc, char **argv);      /* profile.c: the model's costs on this device */
int cmd_profile_comm(int argc, char **argv); /* profile.c: the collectives' costs between ranks */

#endif
