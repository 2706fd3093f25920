/* torch_job.h: a real PyTorch pipelining job for the tests that need one
 * (test_torch, test_browser): examples/torch_pipeline.py under the pprun
 * built here, each rank in the Debian trixie root with torch 2.6 that
 * scripts/torch-root.sh makes (docs/torch.md, "The tests' PyTorch"). */
#ifndef PP_TEST_TORCH_JOB_H
#define PP_TEST_TORCH_JOB_H
#include "launch_testutil.h"

#define TORCH_CHECKOUT PPRUN_TEST_DIR "/.."
#define TORCH_ROOT_SH TORCH_CHECKOUT "/scripts/torch-root.sh"
#define TORCH_EXAMPLE TORCH_CHECKOUT "/examples/torch_pipeline.py"

/* The root is there (made once by scripts/install-deps.sh); made now when
 * it is missing or broken, and the test fails naming why when it cannot
 * be. */
void torch_need_root(void);

/* `pprun run --db DB --nproc-per-node NPROC --steps STEPS --microbatches MB
 * PPRUN_ARGS -- torch-root.sh run python3 torch_pipeline.py --steps STEPS
 * --microbatches MB PROGRAM_ARGS` (either list NULL-terminated, or NULL),
 * with USE_LIBUV unset (pprun sets it to 0 for the ranks: Debian's torch
 * has no libuv); p holds its exit status
 * and output (lt_free). */
void torch_run(lt_proc *p, const char *db, int nproc, int steps, int microbatches, const char *const *pprun_args,
               const char *const *program_args);

#endif
