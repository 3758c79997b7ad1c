/* main.c - cephalo-worker: one rank of a training job. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: cephalo-worker train [options]\n");
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "cephalo-worker: unknown command '%s' (try --help)\n", argv[1]);
    return 2;
}
