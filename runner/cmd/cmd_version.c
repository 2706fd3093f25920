/* cmd_version.c: `pprun version`. */
#include <stdio.h>
#include <string.h>

#include "runner/cmd/cli.h"

int cmd_version(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: pprun version\n\nprints pprun's version\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "pprun version: unexpected argument '%s' (pprun version takes none)\n", argv[1]);
        return 2;
    }
    printf("pprun %s\n", PPRUN_VERSION);
    return 0;
}
