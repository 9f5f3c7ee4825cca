// The qg_dtype values on the host, one table: element sizes and names for api.cpp's
// checks and messages and the GPU launchers' pointer offsets and QG_LOG lines.
// (Device code converts elements with hip/elem.h and its families' own loads.)
#pragma once

#include <stddef.h>

#include "quantgemm.h"

// X(enum suffix, bytes per element, short name for log lines)
#define QG_DTYPES(X)   \
    X(F32, 4, "f32")   \
    X(F16, 2, "f16")   \
    X(BF16, 2, "bf16") \
    X(I32, 4, "i32")   \
    X(U8, 1, "u8")     \
    X(U4X8, 4, "u4x8") /* one int32 word of 8 nibbles */

namespace qg {

// Bytes of one element of dtype d; 4 for a value outside qg_dtype (never asked: the
// callers check d first).
inline size_t dtype_size(int d) {
    switch (d) {
#define QG_X(NAME, BYTES, SHORT) \
    case QG_DTYPE_##NAME: return BYTES;
        QG_DTYPES(QG_X)
#undef QG_X
        default: return 4;
    }
}

// "QG_DTYPE_F16" (messages name the enum value), or nullptr when d is not a qg_dtype value.
inline const char* dtype_name(int d) {
    switch (d) {
#define QG_X(NAME, BYTES, SHORT) \
    case QG_DTYPE_##NAME: return "QG_DTYPE_" #NAME;
        QG_DTYPES(QG_X)
#undef QG_X
        default: return nullptr;
    }
}

// "f16" (QG_LOG lines), or "?" when d is not a qg_dtype value.
inline const char* dtype_short_name(int d) {
    switch (d) {
#define QG_X(NAME, BYTES, SHORT) \
    case QG_DTYPE_##NAME: return SHORT;
        QG_DTYPES(QG_X)
#undef QG_X
        default: return "?";
    }
}

}  // namespace qg
