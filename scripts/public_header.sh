#!/usr/bin/env bash
# public_header.sh GEMM_H GEMM_TYPES_H - prints gemm.h as `make install` installs it: the
# same header, with its `#include "gemm_types.h"` replaced by the two enums of
# common/gemm_types.h that the API uses (gemm_dtype, gemm_math). The rest of
# gemm_types.h is the daemon's vocabulary, not libgemm's API, and libgemm.so does not
# export it, so the installed header stands alone.
set -eu
gemm_h=$1 types_h=$2
enums=$(awk '
    /^typedef enum *\{/ { buf = ""; inside = 1 }
    inside { buf = buf $0 "\n" }
    inside && /^\}/ {
        inside = 0
        if ($0 ~ /^\} *gemm_(dtype|math);/) { printf "%s\n", buf; found++ }
    }
    END { if (found != 2) exit 1 }
' "$types_h") || { echo "public_header.sh: gemm_dtype and gemm_math not found in $types_h" >&2; exit 1; }
grep -q '^#include "gemm_types.h"' "$gemm_h" ||
    { echo "public_header.sh: no #include \"gemm_types.h\" line in $gemm_h" >&2; exit 1; }
while IFS= read -r line; do
    case "$line" in
    '#include "gemm_types.h"'*)
        printf '/* gemm_dtype and gemm_math (common/gemm_types.h in the source tree) */\n%s\n' "$enums" ;;
    *) printf '%s\n' "$line" ;;
    esac
done < "$gemm_h"
