/* cli.h: the subcommands of `pprun`. Each returns the process exit status:
 * 0 success, 2 bad usage or bad input, 1 the job failed (docs/design.md §3). */
#ifndef PP_CLI_H
#define PP_CLI_H

/* argv[0] is the subcommand name. */
typedef int (*pp_command_fn)(int argc, char **argv);

int cmd_version(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_query(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_schedule(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_salvage(int argc, char **argv);
int cmd_serve_query(int argc, char **argv);
int cmd_checkpoint(int argc, char **argv);

#endif
