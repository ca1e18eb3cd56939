/*
 * json_stream_int.h - the JSON decoder's state, shared by its parts: json_stream.c (syntax),
 * json_body.c (what values mean) and json_elements.c (error slots, elements); each calls
 * only the ones after it. Not for use elsewhere.
 */
#ifndef GEMM_JSON_STREAM_INT_H
#define GEMM_JSON_STREAM_INT_H

#include "json_number.h"
#include "json_store.h"
#include "json_stream.h"

#define STR_MAX 255 /* captured keys and option values */

/* R_ROWS: a matrix as rows (R_ROW each). An operand whose first row opens with an array
 * is 3-D: its R_ROWS becomes R_STACK (the batch), whose members are R_MAT (rows). */
enum role { R_SKIP, R_ROOT, R_ROWS, R_ROW, R_MATOBJ, R_SHAPE, R_DATA, R_STACK, R_MAT };
/* K_OPT + i: row i of the options' table (options.h) */
enum key { K_NONE, K_A, K_B, K_SHAPE, K_DATA, K_REF, K_OTHER, K_OPT };
enum state { S_VALUE, S_ARR_FIRST, S_OBJ_FIRST, S_KEY, S_COLON, S_NEXT, S_END, S_STRING, S_NUMBER, S_LITERAL };
/* a value's type: its first character (gemm_json_type_name) */
enum vtype { T_STRING = '"', T_NUMBER = '0', T_BOOL = 't', T_NULL = 'n', T_ARRAY = '[', T_OBJECT = '{' };

/* Error ranks: the lowest noted is reported. Operand x's own (its reference, structure,
 * data length, elements) are kept apart from the body's, so that an operand that turns out
 * to be a reference ({"ref": ID}) drops what its other fields said. */
enum {
    RK_ROOT = 10,     /* the body is not an object (or, for one matrix, not a matrix) */
    RK_DUP = 15,      /* a key the decoder reads, given twice in one object */
    RK_OPT = 20,      /* an option (the first one in the text) */
    RK_REF = 29,      /* + 10 x: operand x's reference cannot be taken or resolved */
    RK_STRUCT = 30,   /* + 10 x: operand x's structure; + 1: its data (after its shape) */
    RK_REFDTYPE = 45, /* + x: a resident operand's dtype against the product's */
    RK_PRODUCT = 50,  /* gemm_check_product (gemm_check_matrix for one matrix) */
    RK_COUNT = 60,    /* + x: data length against the shape */
    RK_MEMORY = 66,   /* an allocation failed */
    RK_ELEM = 70,     /* + x: the first bad element of operand x */
    RK_NONE = 1000
};

typedef struct {
    uint8_t kind; /* '{' or '[' */
    uint8_t role;
    uint8_t x;    /* operand, for matrix roles */
    uint8_t key;  /* objects: the key whose value comes next */
    uint64_t n;   /* values finished in this container */
} frame;

typedef struct {
    const char *name;
    int form;             /* 0 none yet (not given), '[' rows, '{' shape/data, other: wrong type */
    int complete;         /* its value has closed */
    uint64_t rows, ncols; /* rows form: rows closed so far (in the current matrix), elements of row 0 */
    int batched;          /* 3-D: nested three deep, or a shape of three entries */
    uint64_t nmat, mrows; /* 3-D rows form: matrices closed so far, rows of matrix 0 */
    int seen_shape, seen_data;
    int shape_state;      /* 0 not read, 1 valid, 2 invalid */
    uint64_t shape[3];    /* declared [rows, cols] or [batch, rows, cols] */
    uint64_t count;       /* elements read (stored or not): the index of the next one */
    int started;          /* storing has begun (the element type is chosen) */
    int dead;             /* no longer stored */
    uint64_t first_bad;   /* the index of its first element error (UINT64_MAX: none) */
    int rank;             /* its own error (RK_NONE: none) */
    gemm_err err;
    int given;            /* named in the query: known, not in the body */
    int has_ref;          /* written as {"ref": ID} in the body */
    int is_ref;           /* given, or its reference resolved: refm holds it (data NULL) */
    int ref_named;        /* has_ref with a string id in ref_id */
    char ref_id[STR_MAX + 1];
    gemm_matrix refm;
    int data_array;       /* its "data" was an array */
    int data_rows;        /* one matrix: "data" held rows ({"data": [[..]]}) */
    gemm_json_store st;
} operand;

struct gemm_json_stream {
    gemm_limits lim;         /* zeros: no limits */
    const gemm_allocator *alloc;
    gemm_options opt;
    int single;              /* one matrix on its own, not a request with a and b */
    gemm_json_refs refs;     /* operands by reference */
    gemm_dtype fixed_dtype;  /* a given (resident) operand's dtype: the product's, or an error */
    int body_dtype;          /* the body named a valid dtype */
    int seen_key[K_OTHER];   /* "a" and "b" already met */
    uint64_t body_max;        /* the body has at most this many bytes (0: unknown) */
    /* position */
    const char *data;        /* the chunk being fed, which starts at offset base */
    uint64_t base, line, line_start;
    int state;
    int depth;
    frame stack[GEMM_JSON_MAX_DEPTH];
    /* the token in progress */
    int str_key, str_capture, str_over;
    size_t str_len;
    char str[STR_MAX + 1];
    int esc;                 /* 0; 1 after '\'; 2..5 \u digits; 6 '\' and 7 'u' of a low surrogate; 8..11 its digits */
    uint32_t ucode, uhigh;
    unsigned char u8_need, u8_lo, u8_hi; /* bytes still to come of a UTF-8 character, and the
                                            range the next one must fall in */
    const char *lit;
    int lit_pos;
    size_t num_len;
    uint64_t num_off;
    char num[GEMM_JSON_NUMBER_MAX + 2]; /* a cut number: up to one character more than allowed */
    /* errors */
    int failed;              /* a syntax error, in syn */
    gemm_err syn;
    int rank;
    gemm_err err;
    uint64_t nul_off;        /* where a NUL ended the body (0: none; a value came first) */
    gemm_json_mem mem;       /* what the stores hold from the allocator */
    operand op[2];
};

/* ---- json_body.c, called by the tokenizer ------------------------------------------- */

/* A scalar value (string: its text in str when it was captured; number: d) has been read
 * in the container on top of the stack (or is the whole body). */
void gemm_jsb_scalar(gemm_json_stream *s, enum vtype t, const char *str, const gemm_decimal *d);
/* An array or object opens ('[' or '{'): the role it plays, and its operand in *x. */
int gemm_jsb_open(gemm_json_stream *s, char c, int *x);
/* The container f (still on top of the stack) closes. */
void gemm_jsb_close(gemm_json_stream *s, frame *f);
/* A key (in s->str) has been read in the object on top. */
void gemm_jsb_key(gemm_json_stream *s);
/* The body ended without a syntax error: every check that needs the whole body, then the
 * matrices. As gemm_json_stream_finish / gemm_json_stream_finish_matrix. */
int gemm_jsb_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b, gemm_err *err);
int gemm_jsb_finish_matrix(gemm_json_stream *s, gemm_options *opt, gemm_matrix *m, gemm_err *err);
/* Gives back everything the operands hold. */
void gemm_jsb_release(gemm_json_stream *s);

/* ---- json_elements.c: the error slots, and the elements --------------------------------- */

/* Notes an error of this rank in its slot (the body's, or operand x's own: ranks RK_REF,
 * RK_STRUCT, RK_COUNT, RK_ELEM + x) unless one of a lower (or, without replace, equal) rank
 * is there. An error that makes the body fail whatever the elements hold lets the operands
 * it concerns go (both for the body's; the operand's own for its). An operand written as a
 * reference keeps only its reference's errors. */
void gemm_jsb_note(gemm_json_stream *s, int rank, int replace, int status, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
#define bad_matrix(s, rank, ...) gemm_jsb_note(s, rank, 0, 400, "bad_matrix", __VA_ARGS__)
/* The lowest rank noted anywhere (RK_NONE: none). */
int gemm_jsb_best_rank(const gemm_json_stream *s);
/* Stops storing operand o and gives its memory back. */
void gemm_jsb_kill(operand *o);

/* The shape of operand o once known and well formed: 0 not known, 2 or 3 (with a batch). */
int gemm_jsb_known_shape(const operand *o, uint64_t *batch, uint64_t *rows, uint64_t *cols);
/* The next element of operand x is the number d (called by the tokenizer too). */
void gemm_jsb_number(gemm_json_stream *s, int x, const gemm_decimal *d);
/* The elements a declared shape needs; -1 on overflow. */
int gemm_jsb_declared_count(const operand *o, uint64_t *n);
/* The next element of operand x, at [mat][row][col], is not a number. */
void gemm_jsb_other(gemm_json_stream *s, int x, enum vtype t, uint64_t mat, uint64_t row, uint64_t col);
/* Operand x's data has count numbers, a length its shape does not allow. */
void gemm_jsb_count_error(gemm_json_stream *s, int x, uint64_t count);
/* Operand o's elements are all read: assembled in their final type. */
void gemm_jsb_settle(gemm_json_stream *s, operand *o);
/* Operand x once the body has ended: elements checked, converted to d; stopped: too large. */
void gemm_jsb_last_checks(gemm_json_stream *s, int x, gemm_dtype d);

#endif
