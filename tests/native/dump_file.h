// The output file of the native dump programs (decode_dump.cpp, int8_dump.cpp), which
// .ci/isa_check.sh compares byte for byte: argv[1], opened for writing; null after a
// message on a usage error or an unwritable path (exit status in *status).
#pragma once

#include <stdio.h>

inline FILE* open_dump(int argc, char** argv, int* status) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_FILE\n", argv[0]);
        *status = 2;
        return nullptr;
    }
    FILE* f = fopen(argv[1], "wb");
    if (f == nullptr) {
        perror(argv[1]);
        *status = 1;
    }
    return f;
}
