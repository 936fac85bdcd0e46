/*
 * moeinfer: Mixture-of-Experts inference on one machine with a GPU too small for the model.
 *
 * The public C API. Pure C99; every symbol starts with `moe_` / `MOE_`.
 *
 * Lifecycle:
 *
 *     moe_model_params mp;
 *     moe_model_params_init(&mp);
 *     moe_model* model = NULL;
 *     if (moe_model_load("model.gguf", &mp, &model) != MOE_STATUS_OK) {
 *         fprintf(stderr, "load failed: %s\n", moe_last_error());
 *         return 1;
 *     }
 *     moe_model_info info;
 *     moe_model_info_init(&info);
 *     moe_model_get_info(model, &info);
 *     printf("%s: %d layers, %d experts (top-%d)\n",
 *            info.architecture, info.n_layer, info.n_expert, info.n_expert_used);
 *     moe_model_free(model);
 *
 * Conventions:
 *  - Every fallible function returns a moe_status; MOE_STATUS_OK is 0. On failure,
 *    moe_last_error() describes what went wrong (naming the offending field or argument).
 *  - Outputs come last in argument lists. Output pointers are written only on success.
 *  - Params and info structs start with `struct_size`; fill it (and the defaults) with the
 *    matching `_init` function. The library reads and writes only the fields inside struct_size,
 *    so callers compiled against an older header keep working.
 *  - Handles are opaque. Every `_free(NULL)` is a no-op.
 *  - Shapes use GGUF order: ne[0] is the fastest-varying (contiguous) dimension.
 */
#ifndef MOEINFER_H
#define MOEINFER_H

#include <stddef.h>
#include <stdint.h>

#include "moeinfer/moeinfer_version.h"

#if defined(_WIN32)
#  if defined(MOEINFER_BUILDING)
#    define MOE_API __declspec(dllexport)
#  else
#    define MOE_API
#  endif
#else
#  define MOE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------------------------- */

/* Explicitly numbered; numbers are never reused or renumbered. */
typedef enum moe_status {
    MOE_STATUS_OK = 0,
    MOE_STATUS_INVALID_ARGUMENT = 1,    /* caller passed a bad value (NULL, negative, bad enum) */
    MOE_STATUS_NOT_FOUND = 2,           /* file, tensor or key does not exist */
    MOE_STATUS_OUT_OF_RANGE = 3,        /* index or token id outside its valid range, context full */
    MOE_STATUS_RESOURCE_EXHAUSTED = 4,  /* out of host or device memory, budget too small */
    MOE_STATUS_UNIMPLEMENTED = 5,       /* valid request that this build does not support */
    MOE_STATUS_INTERNAL = 6,            /* a bug in moeinfer; please report it */
    MOE_STATUS_IO_ERROR = 7,            /* the operating system refused a read, write or map */
    MOE_STATUS_DATA_CORRUPT = 8,        /* a file is malformed (bad magic, counts, offsets, sizes) */
    MOE_STATUS_FAILED_PRECONDITION = 9, /* the object is not in a state that allows the call */
    MOE_STATUS_CANCELLED = 10           /* a progress callback asked to stop */
} moe_status;

/* Static, human-readable name of a status code ("invalid argument", ...). Never NULL. */
MOE_API const char* moe_status_string(moe_status status);

/* Thread-local description of the last failure of a moe_ call on this thread.
 * Borrowed; valid until the next moe_ call on the same thread. "" when there is none. */
MOE_API const char* moe_last_error(void);

/* Run-time library version, e.g. "0.1.0". Static string. Compare with MOEINFER_VERSION_STRING. */
MOE_API const char* moe_version(void);

/* ---------------------------------------------------------------------------------------------
 * Element types and quantisation formats
 * ------------------------------------------------------------------------------------------- */

/* Numbers equal the ggml/GGUF type ids, so GGUF files map onto them directly. */
typedef enum moe_type {
    MOE_TYPE_F32 = 0,
    MOE_TYPE_F16 = 1,
    MOE_TYPE_Q4_0 = 2,   /* blocks of 32: fp16 scale d, 16 bytes of nibbles; x = (q - 8) * d */
    MOE_TYPE_Q8_0 = 8,   /* blocks of 32: fp16 scale d, 32 int8; x = q * d */
    MOE_TYPE_BF16 = 30,
    MOE_TYPE_MXFP4 = 39  /* blocks of 32: e8m0 scale byte, 16 bytes of e2m1 nibbles */
} moe_type;

/* Name of a type ("f32", "q8_0", "mxfp4", ...), or NULL when the type is unknown. Static. */
MOE_API const char* moe_type_name(int32_t type);

/* Looks a type up by name (case-insensitive). MOE_STATUS_NOT_FOUND for unknown names. */
MOE_API moe_status moe_type_from_name(const char* name, int32_t* out_type);

/* Elements per block (1 for F32/F16/BF16, 32 for the quantised types) and bytes per block. */
MOE_API moe_status moe_type_block_info(int32_t type, int64_t* out_block_size, int64_t* out_block_bytes);

/* Bytes taken by `n` elements of `type`. n must be a multiple of the type's block size. */
MOE_API moe_status moe_type_row_bytes(int32_t type, int64_t n, uint64_t* out_bytes);

/* Converts n float32 values to `type` (bit-exact with ggml's reference quantisers).
 * n must be a multiple of the block size; dst_size must be at least moe_type_row_bytes(type, n). */
MOE_API moe_status moe_quantize(int32_t type, const float* src, int64_t n, void* dst, uint64_t dst_size);

/* Converts n elements of `type` (src_size bytes available) to float32. */
MOE_API moe_status moe_dequantize(int32_t type, const void* src, uint64_t src_size, int64_t n, float* dst);

/* ---------------------------------------------------------------------------------------------
 * Progress reporting
 * ------------------------------------------------------------------------------------------- */

/* Called from the calling thread during long operations with a fraction in [0, 1].
 * Return non-zero to continue, 0 to cancel (the operation then fails with MOE_STATUS_CANCELLED). */
typedef int (*moe_progress_fn)(float fraction, void* user_data);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

/* A loaded model: GGUF metadata, hyper-parameters and the tensor table, weights mapped.
 * Thread safety: immutable after load; any number of threads may query it at once. */
typedef struct moe_model moe_model;

typedef struct moe_model_params {
    uint32_t struct_size;
    /* Map the file's tensor data with mmap (non-zero) or read it into memory (0). Default: 1. */
    int32_t use_mmap;
    /* Optional load progress (may be NULL). Default: NULL. */
    moe_progress_fn progress;
    /* Passed to `progress` unchanged. Borrowed. Default: NULL. */
    void* progress_user_data;
} moe_model_params;

MOE_API void moe_model_params_init(moe_model_params* params);

/* Loads a GGUF model. `params` may be NULL for defaults. On success *out_model owns the model;
 * free it with moe_model_free. Errors: MOE_STATUS_NOT_FOUND (no file), MOE_STATUS_IO_ERROR,
 * MOE_STATUS_DATA_CORRUPT (malformed file; moe_last_error names the field),
 * MOE_STATUS_UNIMPLEMENTED (unknown architecture or tensor type). */
MOE_API moe_status moe_model_load(const char* path, const moe_model_params* params, moe_model** out_model);

/* Frees a model. NULL is a no-op. */
MOE_API void moe_model_free(moe_model* model);

/* Hyper-parameters read from the model's metadata. Strings are borrowed from the model and
 * valid until moe_model_free. Fields an architecture does not use are 0. */
typedef struct moe_model_info {
    uint32_t struct_size;
    const char* architecture; /* "qwen3moe", "gpt-oss" */
    const char* name;         /* general.name, "" when absent */
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_vocab;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t n_ff_expert;      /* hidden size of one expert's FFN */
    int32_t n_ctx_train;
    int32_t sliding_window;   /* 0 when the architecture has none */
    int32_t n_tensors;
    uint64_t n_bytes;         /* bytes of all tensor data */
    uint64_t n_expert_bytes;  /* bytes of the expert tensors (*_exps.*) */
} moe_model_info;

MOE_API void moe_model_info_init(moe_model_info* info);
MOE_API moe_status moe_model_get_info(const moe_model* model, moe_model_info* out_info);

#define MOE_MAX_DIMS 4

/* One tensor of the model. `name` is borrowed from the model. */
typedef struct moe_tensor_info {
    uint32_t struct_size;
    const char* name;
    int32_t type;               /* a moe_type */
    int32_t n_dims;
    int64_t ne[MOE_MAX_DIMS];   /* unused dimensions are 1 */
    uint64_t n_bytes;
    uint64_t file_offset;       /* absolute offset of the data in the file */
} moe_tensor_info;

MOE_API void moe_tensor_info_init(moe_tensor_info* info);

/* Tensor `index` in [0, n_tensors). MOE_STATUS_OUT_OF_RANGE otherwise. */
MOE_API moe_status moe_model_get_tensor(const moe_model* model, int32_t index, moe_tensor_info* out_info);

/* Index of the tensor called `name`; MOE_STATUS_NOT_FOUND when there is none. */
MOE_API moe_status moe_model_find_tensor(const moe_model* model, const char* name, int32_t* out_index);

/* Copies a tensor's raw bytes (in its stored type) into dst (dst_size >= n_bytes). */
MOE_API moe_status moe_model_read_tensor(const moe_model* model, int32_t index, void* dst, uint64_t dst_size);

/* Metadata values by key. Integers of any width and bools read as int64, floats as double.
 * MOE_STATUS_NOT_FOUND when the key is absent, MOE_STATUS_INVALID_ARGUMENT on a type mismatch.
 * The string is borrowed from the model. */
MOE_API moe_status moe_model_meta_int(const moe_model* model, const char* key, int64_t* out_value);
MOE_API moe_status moe_model_meta_float(const moe_model* model, const char* key, double* out_value);
MOE_API moe_status moe_model_meta_string(const moe_model* model, const char* key, const char** out_value);

/* ---------------------------------------------------------------------------------------------
 * Contexts and decoding
 * ------------------------------------------------------------------------------------------- */

/* A context runs one sequence on a model: KV cache, ubatch loop, logits.
 * Thread safety: use a context from one thread at a time; several contexts may share a model. */
typedef struct moe_context moe_context;

/* Where a context computes. */
typedef enum moe_device {
    MOE_DEVICE_CPU = 0,  /* everything on the CPU */
    MOE_DEVICE_CUDA = 1  /* everything on CUDA device 0 (weights uploaded; the model must fit in VRAM) */
} moe_device;

typedef struct moe_context_params {
    uint32_t struct_size;
    /* KV cache capacity in tokens. Default: 4096. */
    int32_t n_ctx;
    /* Tokens per graph evaluation (micro-batch); moe_decode splits longer inputs. Default: 512. */
    int32_t n_ubatch;
    /* CPU threads. Default: 0 (all available cores). */
    int32_t n_threads;
    /* A moe_device. MOE_DEVICE_CUDA needs a build with CUDA (UNIMPLEMENTED otherwise) and a GPU
     * (FAILED_PRECONDITION otherwise). Default: MOE_DEVICE_CPU. */
    int32_t device;
} moe_context_params;

MOE_API void moe_context_params_init(moe_context_params* params);

/* Creates a context. `params` may be NULL for defaults. The model must outlive the context.
 * Errors: INVALID_ARGUMENT (bad params), DATA_CORRUPT / NOT_FOUND (a tensor the architecture needs is
 * missing or has the wrong shape; the message names it), RESOURCE_EXHAUSTED (KV cache allocation). */
MOE_API moe_status moe_context_create(moe_model* model, const moe_context_params* params, moe_context** out_ctx);

/* Frees a context. NULL is a no-op. */
MOE_API void moe_context_free(moe_context* ctx);

/* Evaluates n_tokens tokens of the context's sequence.
 * positions: NULL continues the sequence (positions n_past, n_past+1, ...); otherwise they must be
 * consecutive and start at or before n_past (starting earlier rewinds the sequence to that position).
 * logits_all: non-zero keeps the logits of every token, 0 only those of the last token.
 * Errors: INVALID_ARGUMENT (NULL tokens, n_tokens <= 0, bad positions), OUT_OF_RANGE (a token id
 * outside [0, n_vocab) or the KV cache would overflow n_ctx; nothing is evaluated then). If evaluation
 * fails part-way (e.g. out of memory), the sequence ends where this call started: n_past is the
 * first position of the call, and no logits are available. */
MOE_API moe_status moe_decode(moe_context* ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens,
                              int32_t logits_all);

/* Logits of the last moe_decode: out_n_rows rows of n_vocab floats (1 row unless logits_all).
 * Borrowed; valid until the next moe_decode / moe_kv_clear / moe_context_free on this context.
 * FAILED_PRECONDITION before the first moe_decode. */
MOE_API moe_status moe_get_logits(const moe_context* ctx, const float** out_logits, int32_t* out_n_rows,
                                  int32_t* out_n_vocab);

/* Number of tokens in the KV cache (the next position). */
MOE_API moe_status moe_context_n_past(const moe_context* ctx, int32_t* out_n_past);

/* Empties the KV cache (a new sequence starts at position 0). */
MOE_API moe_status moe_kv_clear(moe_context* ctx);

/* ---------------------------------------------------------------------------------------------
 * Profiling: time per op kind, for the bench tool's verbose mode. Off by default (it synchronises
 * after every op, which costs a little).
 * ------------------------------------------------------------------------------------------- */

typedef struct moe_op_profile {
    const char* op;     /* "MUL_MAT_ID", ... static string */
    const char* backend;/* "cpu", "cuda" static string */
    int64_t count;      /* ops evaluated */
    double seconds;     /* wall time */
} moe_op_profile;

/* Turns profiling on (non-zero) or off, and resets the counters. */
MOE_API moe_status moe_context_set_profiling(moe_context* ctx, int32_t enabled);

/* Copies up to `capacity` entries (op kinds with count > 0) into `entries`; *out_n gets the number of
 * entries available (call with capacity 0 to size the array). */
MOE_API moe_status moe_context_get_profile(const moe_context* ctx, moe_op_profile* entries, int32_t capacity,
                                           int32_t* out_n);

/* ---------------------------------------------------------------------------------------------
 * Synthetic models: valid GGUF files with real MoE shapes and random weights, for tests and
 * benchmarks (llama.cpp loads them too).
 * ------------------------------------------------------------------------------------------- */

typedef struct moe_synth_params {
    uint32_t struct_size;
    /* "qwen3moe" or "gpt-oss". Borrowed during the call. Default: "qwen3moe". */
    const char* architecture;
    /* Preset shape: "qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b", or "tiny" (a few-KB model for
     * unit tests). Shape fields below that are > 0 override the preset. Default: "qwen3-30b-a3b"
     * for qwen3moe, "gpt-oss-20b" for gpt-oss. */
    const char* preset;
    int32_t n_layer;        /* Default: 0 (preset) */
    int32_t n_embd;         /* Default: 0 (preset) */
    int32_t n_vocab;        /* Default: 0 (preset: the real model's vocabulary size; "tiny" uses 512) */
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t n_ff_expert;
    /* Type of the expert tensors (a moe_type). Default: -1 (preset: Q8_0 for qwen3moe, MXFP4 for gpt-oss). */
    int32_t expert_type;
    /* Type of the other 2-D weights (attention, embeddings, output; routers stay F32). Default: -1 (F16). */
    int32_t dense_type;
    /* Seed of the deterministic random weights. Default: 42. */
    uint64_t seed;
    /* Routing skew in [0, 1): 0 routes tokens evenly over the experts (like a trained model);
     * larger values make a growing set of experts rarely selected (as in GPT-OSS). Default: 0. */
    float routing_skew;
    /* Optional progress (may be NULL). Default: NULL. */
    moe_progress_fn progress;
    void* progress_user_data;
} moe_synth_params;

/* Fills defaults for `architecture` ("qwen3moe" or "gpt-oss"; NULL means "qwen3moe"). */
MOE_API moe_status moe_synth_params_init(moe_synth_params* params, const char* architecture);

/* Writes a synthetic model to `path`, streaming (constant memory whatever the size). */
MOE_API moe_status moe_synth_write(const char* path, const moe_synth_params* params);

/* ---------------------------------------------------------------------------------------------
 * Bandwidth measurement: how fast host memory is read and how fast data crosses the host-device
 * link, for users sizing a machine and for the scheduler's calibration.
 * ------------------------------------------------------------------------------------------- */

typedef struct moe_bandwidth_params {
    uint32_t struct_size;
    /* A moe_device. MOE_DEVICE_CPU measures host_read only; MOE_DEVICE_CUDA measures host_read and
     * the four copies between host memory and CUDA device 0. Default: MOE_DEVICE_CPU. */
    int32_t device;
    /* Bytes per host<->device copy (each of the device, pinned and pageable buffers has this size).
     * At least 4096. Default: 1 GiB (1073741824). */
    uint64_t bytes;
    /* Bytes of the host buffer that host_read reads. 0 reads max(bytes, 2 GiB), many times any CPU's
     * last-level cache, so that caches do not inflate the figure; smaller explicit values (at least
     * 4096) are allowed, e.g. for quick tests, but then caches may. Default: 0. */
    uint64_t host_bytes;
    /* CPU threads reading the host buffer. 0 = all available cores. Default: 0. */
    int32_t n_threads;
    /* Timed runs per figure, after one untimed warm-up; the median is reported. 1..1000. Default: 5. */
    int32_t repetitions;
} moe_bandwidth_params;

MOE_API void moe_bandwidth_params_init(moe_bandwidth_params* params);

/* Figures in GB/s (1e9 bytes per second), each the median of `repetitions` timed runs. Fields a
 * device does not measure are 0. */
typedef struct moe_bandwidth_result {
    uint32_t struct_size;
    double h2d_pinned;     /* host -> device from page-locked (cudaHostAlloc) memory */
    double h2d_pageable;   /* host -> device from ordinary (pageable) memory */
    double d2h_pinned;     /* device -> host into page-locked memory */
    double d2h_pageable;   /* device -> host into ordinary memory */
    double host_read;      /* all n_threads threads reading one host buffer */
    uint64_t bytes;        /* bytes per host<->device copy (0 for MOE_DEVICE_CPU) */
    uint64_t host_bytes;   /* bytes of the buffer host_read read */
    int32_t n_threads;     /* threads used for host_read (the request, capped at the available cores) */
    int32_t repetitions;   /* timed runs per figure */
} moe_bandwidth_result;

MOE_API void moe_bandwidth_result_init(moe_bandwidth_result* result);

/* Measures the bandwidths `params` asks for (NULL: defaults) into *out_result (initialise it with
 * moe_bandwidth_result_init). Takes a few seconds with the defaults and allocates, for CUDA, 2 x
 * `bytes` of host memory and `bytes` of device memory, plus the host_read buffer; everything is
 * freed before it returns. Runs on the calling thread (host_read uses a pool of n_threads).
 * Thread safety: callable from any thread, but concurrent calls (or inference) share the memory and
 * the link and lower each other's figures.
 * Errors: INVALID_ARGUMENT (bad params; the message names the field), UNIMPLEMENTED (MOE_DEVICE_CUDA
 * in a build without CUDA), FAILED_PRECONDITION (no CUDA device), RESOURCE_EXHAUSTED (a buffer
 * could not be allocated). */
MOE_API moe_status moe_measure_bandwidth(const moe_bandwidth_params* params, moe_bandwidth_result* out_result);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEINFER_H */
