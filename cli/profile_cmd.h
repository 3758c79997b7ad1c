/* profile_cmd.h - `cephalo profile` (docs/profile.md): measures the cost model of the local
 * devices for one model with `cephalo-worker profile` (once per distinct device type) and
 * `cephalo-worker profile-comm` (on all the devices at once), writes the profile file and merges
 * it into the profile store. */
#ifndef CEPHALO_PROFILE_CMD_H
#define CEPHALO_PROFILE_CMD_H

/* Exit status: 0 done, 1 a measurement failed, 2 bad input. */
int profile_main(int argc, char **argv);

#endif
