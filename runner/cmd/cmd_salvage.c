/* cmd_salvage.c: `pprun salvage`: what the guard of a `pprun run` job runs
 * when the job's launcher was killed (runner/job/job_salvage.h): the job's
 * last trace records and its end into the database. Started by the guard
 * with the job's trace rings as descriptors 3, 4, ...; not for users, and
 * not listed by `pprun --help`. */
#include "runner/cmd/cli.h"
#include "runner/job/job_salvage.h"

int cmd_salvage(int argc, char **argv) { return job_salvage_main(argc, argv); }
