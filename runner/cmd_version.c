/* cmd_version.c: `pprun version`. */
#include <stdio.h>

#include "runner/cli.h"

int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("pprun %s\n", PPRUN_VERSION);
    return 0;
}
