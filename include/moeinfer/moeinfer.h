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

/* Numbers equal the ggml/GGUF type ids, so GGUF files map onto them directly. Every type the GGUF
 * specification defines is listed: a model file holding any of them loads and is described (names,
 * sizes); what this build can do with each one says moe_type_capabilities. Ids missing here (4, 5,
 * 31-33, 36-38) were removed from ggml and are refused when a file uses them. */
typedef enum moe_type {
    MOE_TYPE_F32 = 0,
    MOE_TYPE_F16 = 1,
    MOE_TYPE_Q4_0 = 2,   /* blocks of 32: fp16 scale d, 16 bytes of nibbles; x = (q - 8) * d */
    MOE_TYPE_Q4_1 = 3,   /* blocks of 32: fp16 scale d and min m, nibbles; x = q * d + m */
    MOE_TYPE_Q5_0 = 6,   /* blocks of 32: fp16 scale d, 5-bit q; x = (q - 16) * d */
    MOE_TYPE_Q5_1 = 7,   /* blocks of 32: fp16 scale d and min m, 5-bit q; x = q * d + m */
    MOE_TYPE_Q8_0 = 8,   /* blocks of 32: fp16 scale d, 32 int8; x = q * d */
    MOE_TYPE_Q8_1 = 9,
    MOE_TYPE_Q2_K = 10,  /* blocks of 256 in 16 groups: 4-bit group scales and mins, 2-bit q */
    MOE_TYPE_Q3_K = 11,  /* blocks of 256 in 16 groups: 6-bit group scales, 3-bit q */
    MOE_TYPE_Q4_K = 12,  /* blocks of 256 in 8 groups: 6-bit group scales and mins, 4-bit q */
    MOE_TYPE_Q5_K = 13,  /* blocks of 256 in 8 groups: 6-bit group scales and mins, 5-bit q */
    MOE_TYPE_Q6_K = 14,  /* blocks of 256 in 16 groups: int8 group scales, 6-bit q */
    MOE_TYPE_Q8_K = 15,  /* blocks of 256: float scale, 256 int8, 16 int16 sums (an activation type) */
    MOE_TYPE_IQ2_XXS = 16,
    MOE_TYPE_IQ2_XS = 17,
    MOE_TYPE_IQ3_XXS = 18,
    MOE_TYPE_IQ1_S = 19,
    MOE_TYPE_IQ4_NL = 20, /* blocks of 32: fp16 scale d, nibbles indexing a non-linear grid of 16 values */
    MOE_TYPE_IQ3_S = 21,
    MOE_TYPE_IQ2_S = 22,
    MOE_TYPE_IQ4_XS = 23, /* blocks of 256 in 8 groups: 6-bit group scales, IQ4_NL's grid */
    MOE_TYPE_I8 = 24,
    MOE_TYPE_I16 = 25,
    MOE_TYPE_I32 = 26,
    MOE_TYPE_I64 = 27,
    MOE_TYPE_F64 = 28,
    MOE_TYPE_IQ1_M = 29,
    MOE_TYPE_BF16 = 30,
    MOE_TYPE_TQ1_0 = 34,
    MOE_TYPE_TQ2_0 = 35,
    MOE_TYPE_MXFP4 = 39, /* blocks of 32: e8m0 scale byte, 16 bytes of e2m1 nibbles */
    MOE_TYPE_NVFP4 = 40,
    MOE_TYPE_Q1_0 = 41
} moe_type;

/* Name of a type as ggml spells it ("f32", "q8_0", "q4_K", "iq2_xxs", ...), or NULL when the id is not a
 * GGUF type. Static. */
MOE_API const char* moe_type_name(int32_t type);

/* What this build can do with a type: moe_type_capabilities sets these bits. */
#define MOE_TYPE_CAN_QUANTIZE 1u   /* moe_quantize converts float32 to it */
#define MOE_TYPE_CAN_DEQUANTIZE 2u /* moe_dequantize converts it to float32 */

/* The MOE_TYPE_CAN_* bits of a type (0 for a type this build can only describe: its tensors load and
 * are listed, but a context whose weights use it fails to create, naming the tensor and the type).
 * Being convertible does not mean a backend computes with the type: moe_context_create says, naming
 * the first weight no backend supports. MOE_STATUS_UNIMPLEMENTED for an id that is not a GGUF type. */
MOE_API moe_status moe_type_capabilities(int32_t type, uint32_t* out_flags);

/* Looks a type up by name (case-insensitive). MOE_STATUS_NOT_FOUND for unknown names. */
MOE_API moe_status moe_type_from_name(const char* name, int32_t* out_type);

/* Elements per block (1 for F32/F16/BF16 and the integer types, 32 or 256 for the quantised types) and
 * bytes per block. */
MOE_API moe_status moe_type_block_info(int32_t type, int64_t* out_block_size, int64_t* out_block_bytes);

/* Bytes taken by `n` elements of `type`. n must be a multiple of the type's block size. */
MOE_API moe_status moe_type_row_bytes(int32_t type, int64_t n, uint64_t* out_bytes);

/* Converts n float32 values to `type`: bit-exact with ggml's reference quantisers (and gguf-py's) for
 * F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4, ggml's reference scheme for Q8_K; for the other
 * K-quants and IQ4_NL / IQ4_XS a simple
 * rounding scheme of ours (each value within a stated bound of the input, not ggml's error-minimising
 * search), meant for synthetic files and tests. n must be a multiple of the block size; dst_size must
 * be at least moe_type_row_bytes(type, n). MOE_STATUS_UNIMPLEMENTED for a type without
 * MOE_TYPE_CAN_QUANTIZE. */
MOE_API moe_status moe_quantize(int32_t type, const float* src, int64_t n, void* dst, uint64_t dst_size);

/* Converts n elements of `type` (src_size bytes available) to float32, bit-exact with ggml's dequantisers.
 * MOE_STATUS_UNIMPLEMENTED for a type without MOE_TYPE_CAN_DEQUANTIZE. */
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
    /* Optional load progress (may be NULL): with use_mmap = 0 the fraction of the file read; a mapped
     * file reports 0 and 1 only, as mapping reads nothing (its pages are read when a context locks or
     * uploads them: moe_context_params.progress). Default: NULL. */
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
    const char* architecture; /* "qwen3moe", "gpt-oss", "glm4moe" */
    const char* name;         /* general.name, "" when absent */
    int32_t n_layer;          /* layers run: glm4moe's trailing NextN layers (nextn_predict_layers) not counted */
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
    uint64_t n_expert_bytes;  /* bytes of the expert tensors (*_exps.*) of the layers run */
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
    MOE_DEVICE_CPU = 0,      /* everything on the CPU */
    MOE_DEVICE_CUDA = 1,     /* the GPUs plus the CPU: weights placed by the placement fields below
                              * (default: all on the GPU if they fit, else experts spill to host RAM;
                              * with several GPUs, the devices field says which are used) and ops
                              * scheduled per moe_sched_policy */
    MOE_DEVICE_EMULATED = 2, /* like MOE_DEVICE_CUDA, with a host-memory backend playing the device: its
                              * own buffers and explicit copies, computing with the CPU kernels. For
                              * testing placement and scheduling without a GPU; slower than CPU. */
    MOE_DEVICE_AUTO = 3      /* MOE_DEVICE_CUDA when this build has the CUDA backend and a CUDA device is
                              * present, else MOE_DEVICE_CPU (as a CUDA build of llama.cpp uses the GPU
                              * when there is one). Resolved when the context is created:
                              * moe_context_get_device says which one was chosen. */
} moe_device;

/* ---------------------------------------------------------------------------------------------
 * Hybrid scheduling policy (MOE_DEVICE_CUDA / MOE_DEVICE_EMULATED contexts)
 * ------------------------------------------------------------------------------------------- */

/* Ops whose weights may sit in host RAM and that the scheduler may offload to the device (uploading
 * their weights) instead of computing them on the CPU. Names (moe_offload_op_name): "mul_mat",
 * "mul_mat_id", "moe_up_gate". */
typedef enum moe_offload_op {
    MOE_OFFLOAD_MUL_MAT = 0,      /* dense matrix products (attention projections, router, output) */
    MOE_OFFLOAD_MUL_MAT_ID = 1,   /* expert matrix products (the down projection) */
    MOE_OFFLOAD_MOE_UP_GATE = 2,  /* fused expert up + gate + activation */
    MOE_OFFLOAD_OP_COUNT = 3
} moe_offload_op;

typedef struct moe_offload_rule {
    /* Non-zero: the op may be offloaded. */
    int32_t enabled;
    /* Offload only when the ubatch has at least this many tokens. -1: the default, measured at context
     * creation on CUDA (backend option offload_calibration; docs/POLICY.md), else 32 for mul_mat and
     * 32 * n_expert / n_expert_used for the expert ops (each expert then sees about 32 tokens);
     * moe_sched_stats.offload_min_batch says which is in effect. */
    int32_t min_batch;
} moe_offload_rule;

typedef enum moe_expert_copy {
    MOE_EXPERT_COPY_FULL = 0,        /* upload whole expert tensors */
    MOE_EXPERT_COPY_ACTIVE_ONLY = 1,     /* read the router's choices back (once per layer) and upload only the
                                          * selected experts, adjacent ones in one copy */
    MOE_EXPERT_COPY_ACTIVE_PREFETCH = 2, /* ACTIVE_ONLY that first uploads, before the readback, the experts
                                          * the layer selected in the previous ubatch (overlapping the
                                          * previous layer's compute), then only the ones still missing.
                                          * Uploads more bytes than ACTIVE_ONLY when the routing shifts,
                                          * but hides most of the readback stall */
    MOE_EXPERT_COPY_AUTO = 3             /* ACTIVE_ONLY where it cannot lose, FULL elsewhere, per expert op:
                                          * ACTIVE_ONLY while its ubatch holds fewer than 2 * n_expert
                                          * (token, expert) pairs (n_tokens * n_expert_used), where uniform
                                          * routing leaves more than 13% of the experts unselected; FULL
                                          * from there on, where nearly every expert is selected and the
                                          * readback would stall the upload stream for little. The default */
} moe_expert_copy;

typedef struct moe_sched_policy {
    uint32_t struct_size;
    /* Per moe_offload_op. Default: enabled, min_batch -1. */
    moe_offload_rule offload[MOE_OFFLOAD_OP_COUNT];
    /* A moe_expert_copy. Default: MOE_EXPERT_COPY_AUTO. With the expert split on, the device part of a
     * split layer uploads its group's experts: all of them (FULL) or the selected ones (ACTIVE copies). */
    int32_t expert_copy;
    /* Non-zero: expert biases whose expert weights are in host RAM are kept on both sides, so that host
     * ops and offloaded ops each read their own copy (no PCIe round trip). Default: 1. */
    int32_t bias_dup;
    /* Device memory for the staging slots that offloaded weights are uploaded into, in bytes; more slots
     * let uploads run further ahead of compute. 0: automatic (6 slots of the largest host-resident
     * weight, 8 when expert_split is on). Too small for one slot -> INVALID_ARGUMENT. Default: 0. */
    uint64_t offload_vram_budget;
    /* Expert split, for layers whose expert weights are all in host RAM, at batch sizes where their
     * expert ops are offloaded: the host computes this many of the layer's experts (those expected to
     * see the fewest tokens, from the previous prompt ubatch) while the device computes the others,
     * whose weights alone cross PCIe; the two parts' outputs are added. MOE_EXPERT_SPLIT_AUTO (-1)
     * picks the count per layer from the measured upload time and host expert throughput, then times
     * the first ubatches of each size (unsplit, split, split, unsplit, the faster mean wins; ubatches
     * that allocate memory are timed again; a size without a decided trial of its own takes the verdict
     * of the closest decided size in its power-of-two range; none run while profiling) and keeps it
     * (moe_sched_stats.n_split_trials counts those ubatches); 0 turns the split off. Below -1 ->
     * INVALID_ARGUMENT. Default: MOE_EXPERT_SPLIT_AUTO (callers built before this field get it too).
     * Where expert weights spill to host RAM, a context created with it on reserves device memory for
     * it (two more upload slots, the split's larger activations), whether or not the trials then keep
     * it; turned on later by moe_context_set_policy, a decode that lacks that memory fails with
     * RESOURCE_EXHAUSTED. */
    int32_t expert_split;
    /* Expert cache: device memory, in bytes, where the experts of host-resident expert matrices stay once
     * uploaded for an offloaded op, so later ubatches upload only the experts not there yet (FULL and
     * ACTIVE copies alike; results are bit for bit those without it). An entry holds one expert matrix
     * (the largest host-resident one's bytes) and fills expert by expert; matrices are evicted least
     * requested first, counted over recent ubatches. MOE_EXPERT_CACHE_AUTO (-1): half of the device's
     * free memory beyond 1 GiB when the first expert is uploaded (after the weights, the KV cache and
     * the first ubatch's arenas), fewer entries if the device refuses; 0 turns it off; a positive
     * value smaller than one entry -> INVALID_ARGUMENT. Emptied by moe_context_set_policy.
     * moe_sched_stats.n_cache_hits / n_cache_misses / bytes_cache_saved count its effect. Default:
     * MOE_EXPERT_CACHE_AUTO (callers built before this field get it too). */
    int64_t expert_cache;
} moe_sched_policy;

#define MOE_EXPERT_SPLIT_AUTO (-1)
#define MOE_EXPERT_CACHE_AUTO (-1)

MOE_API void moe_sched_policy_init(moe_sched_policy* policy);

/* "mul_mat", "mul_mat_id", "moe_up_gate"; NULL for an unknown op. */
MOE_API const char* moe_offload_op_name(int32_t op);

/* Applies an offload spec "op=N|off|on[,op=N|off|on...]" to `policy` ("all" names every op; N is
 * min_batch, "on" restores the default threshold). INVALID_ARGUMENT names the bad entry (unknown op,
 * negative or non-numeric threshold); `policy` is unchanged then. */
MOE_API moe_status moe_sched_policy_parse_offload(moe_sched_policy* policy, const char* spec);

/* The largest thread count the library accepts (moe_context_params.n_threads,
 * moe_bandwidth_params.n_threads); a larger one is INVALID_ARGUMENT naming the field. */
#define MOE_MAX_THREADS 4096

typedef struct moe_context_params {
    uint32_t struct_size;
    /* KV cache capacity in tokens. Default: 4096. */
    int32_t n_ctx;
    /* Tokens per graph evaluation (micro-batch); moe_decode splits longer inputs. Default: 512. */
    int32_t n_ubatch;
    /* CPU threads, 0..MOE_MAX_THREADS (0: all available cores; more than the cores is allowed, but
     * no more run than oneTBB may use). A device context's creation also reads its host-resident
     * weights into memory of its own (to page-lock them) on this many threads, at most 8. Default: 0. */
    int32_t n_threads;
    /* A moe_device. MOE_DEVICE_CUDA needs a build with CUDA (UNIMPLEMENTED otherwise) and a GPU
     * (FAILED_PRECONDITION otherwise); MOE_DEVICE_AUTO picks CUDA when both are there, else the CPU
     * (moe_context_get_device tells which). Default: MOE_DEVICE_AUTO. */
    int32_t device;

    /* Placement of the weights (device contexts only; a context that MOE_DEVICE_AUTO made a CPU context
     * ignores these fields, as an explicit MOE_DEVICE_CPU does). Applied in this order, first match wins:
     * 1. tensor_overrides: llama.cpp's -ot syntax, "regex=BACKEND[,regex=BACKEND...]" searched in the
     *    GGUF tensor names (e.g. "exps=CPU", "ffn_(up|gate|down)_exps\.weight=CPU"); BACKEND is CPU
     *    (host RAM) or GPU / CUDA0 / DEVICE (device memory), case-insensitive. Bad regex or unknown
     *    backend -> INVALID_ARGUMENT naming the entry. NULL or "": none. Borrowed during the call.
     * 2. n_cpu_moe: the expert tensors (weights and biases) of layers 0 .. n_cpu_moe-1 stay in host RAM.
     * 3. n_gpu_layers: the weights of layers n_layer-n_gpu_layers .. n_layer-1 go to the device, the
     *    rest stay in host RAM; the output head goes to the device when n_gpu_layers > n_layer; -1: all.
     * 4. vram_budget: if what is left for the device exceeds it, the experts of the layers whose expert
     *    tensors 1-3 left on the device (none pinned by an override) are placed one by one, hottest first
     *    by the model's expert profile (moe_model_set_expert_profile; without one, whole layers from the
     *    last): a layer keeps what fits of its experts resident in device memory and all of them in host
     *    RAM; if even the other weights exceed it, expert tensors move to host RAM whole (largest first,
     *    from the first layer) until it fits; still too large -> RESOURCE_EXHAUSTED.
     * Host-resident weights are used in place, from the model's mapped file (or its bytes read in with
     * use_mmap = 0), not copied: the model needs its file's size in RAM. So that uploads from them run at
     * full speed, the pages they cover are page-locked in place (cudaHostRegister) where the device
     * allows it, else they stay pageable (moe_sched_stats.weights_host_pinned_bytes says which). */
    const char* tensor_overrides;
    int32_t n_cpu_moe;      /* Default: 0 */
    int32_t n_gpu_layers;   /* Default: -1 (all) */
    /* Bytes of device memory for weights. 0: the device's free memory minus the KV cache, activations,
     * offload slots and a 1 GiB reserve; if the device then refuses the memory that placement asks for,
     * more expert tensors move to host RAM until it fits. An explicit budget the device refuses is
     * RESOURCE_EXHAUSTED naming it. Default: 0. */
    uint64_t vram_budget;
    /* Scheduling policy; NULL for moe_sched_policy_init's defaults. Borrowed during the call. */
    const moe_sched_policy* policy;
    /* Optional progress of creation's long work (may be NULL): the fraction of bytes done of
     * page-locking the host-resident weights (which reads them from disk when the file is not in the
     * page cache) and then of uploading the device-resident ones; nothing is reported for CPU
     * contexts, which use the weights in place. Called on the thread that creates the context. As
     * every moe_progress_fn: return non-zero to continue, 0 to cancel (MOE_STATUS_CANCELLED, nothing
     * leaked). Default: NULL. */
    moe_progress_fn progress;
    void* progress_user_data;  /* passed to `progress` unchanged. Default: NULL */

    /* Several devices in one host (llama.cpp's -dev, -sm, -ts, -mg; MOE_DEVICE_CUDA and
     * MOE_DEVICE_EMULATED contexts, ignored by CPU ones). Each model layer (its attention, dense and
     * expert weights and its KV cache) belongs to one device and its ops run there; the ops outside the
     * layers (embeddings, output head) run on the device of the layer next to them; activations cross
     * between devices by peer copy where they reach each other, else through host memory. Within a device, the placement fields above apply as for one
     * device (experts spill to host RAM first under its budget; ops whose weights are in host RAM are
     * offloaded to the device of their layer). In tensor_overrides, CUDAn names device n of this list
     * (its layer goes with the tensor; "CUDA3" on a 2-device context is INVALID_ARGUMENT), GPU / CUDA /
     * DEVICE the device of the tensor's layer.
     * devices: the ordinals of the devices, n_devices entries, each at most once (the first is CUDA0 of
     * the overrides). The emulated backend plays up to 8 devices, each with its own memory
     * (MOEINFER_EMULATED_VRAM bytes). MOE_DEVICE_CUDA: any GPUs of the machine by CUDA ordinal (an
     * ordinal it lacks is INVALID_ARGUMENT naming the entry). Borrowed during the call.
     * NULL with n_devices 0: the devices the backend shows (every GPU; the emulated backend, as many as
     * its backend option emulated_devices, default 1), indexed in ordinal order by tensor_split,
     * main_gpu, vram_budgets and CUDAn. One shown: that one, as ever. Several, with split_mode
     * MOE_SPLIT_LAYER and neither tensor_split nor an override naming a device (CUDAn): the default
     * fills them one after the other, the device offering the most memory for weights first (its
     * vram_budgets entry where given, else its free memory; the lower ordinal among equals), each taking
     * the next layers while the weights the placement fields leave to the device fit its budget (given,
     * or the default budget of a device holding those layers): a model that fits one device stays on it
     * (a one-device context), one that fits them all takes as few as it needs (activations cross
     * between them, docs/MULTI_GPU.md), and one that does not has its layers split over all of them by
     * their budgets (else free memory), each spilling experts to host RAM under its own budget (where
     * that split gives a device more of the weights other than experts than it holds, the layers as
     * those weights fill the devices in order; where not even those weights fit them, the first device
     * alone, whose refusal names its budget).
     * A GPU the default cannot open or ask for its free memory (another process holds it in
     * exclusive-process mode, or it has failed) is left out of it; only where none answers is that an
     * error. n_devices = 1 with the device (-dev CUDA0), or MOE_SPLIT_NONE (main_gpu), keeps to one device;
     * moe_context_get_device_info says which devices a context uses.
     * Default: NULL, 0. */
    const int32_t* devices;
    int32_t n_devices;
    /* A moe_split_mode. Default: MOE_SPLIT_LAYER. */
    int32_t split_mode;
    /* Proportions of the layers per device (llama.cpp -ts 3,1), n_tensor_split entries (at most
     * n_devices; missing ones are 0), each finite and >= 0, not all 0: the layers, in order, are dealt
     * out in runs of these proportions; a device whose entry is 0 is left out of the context (-ts 1,0:
     * the first device alone), unless an override names a device (CUDAn). NULL with n_tensor_split 0: with a device list, the vram_budgets
     * where given, else each device's free memory; without one, the default above. Borrowed during the
     * call. Default: NULL, 0. */
    const float* tensor_split;
    int32_t n_tensor_split;
    /* With MOE_SPLIT_NONE: the index in the device list (without one, the ordinal) of the only device
     * used. Default: 0. */
    int32_t main_gpu;
    /* Bytes of device memory for weights per device (as vram_budget for one device), n_vram_budgets
     * entries (at most the devices: n_devices, or those shown without a list; missing ones take
     * vram_budget). NULL with n_vram_budgets 0: vram_budget
     * for every device. Borrowed during the call. Default: NULL, 0. */
    const uint64_t* vram_budgets;
    int32_t n_vram_budgets;
    /* Backend switches, "key=value[,key=value...]" (moe_backend_options_help lists the keys, their
     * values and defaults; docs/ENVIRONMENT.md too), e.g. "cuda_graphs=off,offload_calibration=off".
     * A key given here wins; a key left out takes its environment variable where it has one (with the
     * variable's own rules), else its default. Keys of a backend the context does not create are
     * checked and ignored. Unknown key, a key given twice or a bad value -> INVALID_ARGUMENT naming the
     * entry. NULL or "": none. Borrowed during the call. Default: NULL. */
    const char* backend_options;
} moe_context_params;

/* How a context spreads the model over its devices (moe_context_params.split_mode; llama.cpp's -sm). */
typedef enum moe_split_mode {
    MOE_SPLIT_NONE = 0,  /* one device: moe_context_params.main_gpu */
    MOE_SPLIT_LAYER = 1, /* whole layers per device, by tensor_split */
    MOE_SPLIT_ROW = 2    /* rows of every matrix across devices: UNIMPLEMENTED */
} moe_split_mode;

MOE_API void moe_context_params_init(moe_context_params* params);

/* The keys moe_context_params.backend_options takes: one "  key=VALUES  (default D; env VAR)" line per
 * key, then a line of what it does. Static text. */
MOE_API const char* moe_backend_options_help(void);

/* Creates a context. `params` may be NULL for defaults. The model must outlive the context.
 * Errors: INVALID_ARGUMENT (bad params), DATA_CORRUPT / NOT_FOUND (a tensor the architecture needs is
 * missing or has the wrong shape; the message names it), RESOURCE_EXHAUSTED (device or host memory for
 * the weights or the KV cache; the message says what was allocated, the bytes asked and, for device
 * memory, the bytes free). Nothing is leaked on failure; the model and other contexts are unaffected. */
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
 * first position of the call, and no logits are available. RESOURCE_EXHAUSTED when the device cannot
 * hold the activations (or upload slots) of a ubatch larger than any before; the message says what
 * was allocated, the bytes asked and free. The context stays usable: smaller ubatches still run. */
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

/* Replaces the context's scheduling policy (takes effect at the next moe_decode). INVALID_ARGUMENT for
 * bad values (negative min_batch other than -1, unknown expert_copy, budget too small for one slot). */
MOE_API moe_status moe_context_set_policy(moe_context* ctx, const moe_sched_policy* policy);

/* The context's policy with defaults resolved (min_batch -1 replaced by the threshold in use). */
MOE_API moe_status moe_context_get_policy(const moe_context* ctx, moe_sched_policy* out_policy);

/* The device the context computes on: MOE_DEVICE_CPU, MOE_DEVICE_CUDA or MOE_DEVICE_EMULATED, never
 * MOE_DEVICE_AUTO (that is resolved by moe_context_create). */
MOE_API moe_status moe_context_get_device(const moe_context* ctx, int32_t* out_device);

/* Where a weight lives. */
typedef enum moe_location { MOE_LOCATION_HOST = 0, MOE_LOCATION_DEVICE = 1 } moe_location;

/* Location of the weight tensor `name` (a GGUF tensor name). *out_duplicated is set to 1 when a copy
 * is also kept on the other side (bias duplication), else 0; it may be NULL. NOT_FOUND for an
 * unknown name. */
MOE_API moe_status moe_context_tensor_location(const moe_context* ctx, const char* name, int32_t* out_location,
                                               int32_t* out_duplicated);

/* Scheduler statistics, accumulated since the context was created or moe_context_reset_stats.
 * Cheap and always on. */
typedef struct moe_sched_stats {
    uint32_t struct_size;
    uint64_t n_ubatches;
    uint64_t n_splits;               /* runs of consecutive ops on one side, over all ubatches */
    uint64_t bytes_weights_full;     /* weights uploaded whole (FULL expert copies, dense offload, biases) */
    uint64_t bytes_weights_experts;  /* expert slices uploaded by MOE_EXPERT_COPY_ACTIVE_ONLY */
    uint64_t bytes_weights_skipped;  /* expert bytes ACTIVE_ONLY did not upload (unselected experts) */
    uint64_t bytes_activations;      /* activations copied between host and device, both ways */
    uint64_t n_weight_copies;        /* weight copy operations (a coalesced run of experts is one) */
    uint64_t n_activation_copies;
    uint64_t n_id_readbacks;         /* ACTIVE_ONLY: router choices read back to the host */
    uint64_t n_offloaded[MOE_OFFLOAD_OP_COUNT];  /* ops with host weights computed on the device */
    uint64_t n_kept_host[MOE_OFFLOAD_OP_COUNT];  /* ops with host weights computed on the host */
    uint64_t n_ops_host;             /* all ops computed on the host */
    uint64_t n_ops_device;           /* all ops computed on the device */
    double seconds_total;            /* wall time of the ubatches */
    double seconds_host_compute;     /* host splits' compute */
    double seconds_wait;             /* host blocked on the device (id readbacks, synchronisation) */
    uint64_t weights_host_bytes;     /* placement: weight bytes in host RAM (each tensor padded to 256) */
    uint64_t weights_device_bytes;   /* placement: weight bytes in device memory (duplicates included,
                                      * each tensor padded to 256) */
    int32_t n_layer;                 /* dimensions of moe_context_get_expert_counts */
    int32_t n_expert;
    /* Host time spent handing device splits to the device (kernels run asynchronously: this is the
     * queueing cost, not the device's compute time). seconds_total minus this, host compute and wait
     * is the scheduler's own overhead (graph building, planning, copies queued). */
    double seconds_device_submit;
    /* Expert split (moe_sched_policy.expert_split): expert blocks computed in two parts, and the experts
     * those blocks left to the host, summed over ubatches. */
    uint64_t n_split_layers;
    uint64_t n_split_host_experts;
    /* Ubatches timed as samples of MOE_EXPERT_SPLIT_AUTO's trials (with and without the split, the
     * first ubatches of each size): while this grows, the split is still being decided. */
    uint64_t n_split_trials;
    /* Of the host-resident weights of a device context, the bytes page-locked in place (registered
     * with the device) so that their uploads run at full speed; the rest are pageable, where the
     * device would not lock them, and their uploads are staged (slower, same results). Tensor bytes
     * without padding; 0 for CPU contexts. */
    uint64_t weights_host_pinned_bytes;
    /* Contexts over several devices: bytes of activations that crossed between devices, through host
     * memory counted once leaving their device and once arriving at each device that reads them (the
     * residual stream between two layers on different devices: 2 * n_embd * 4 bytes per token), by peer
     * copy once, arriving. moe_context_get_device_stats counts each on the device it left or entered. */
    uint64_t bytes_between_devices;
    /* Expert cache (moe_sched_policy.expert_cache), counted only while it is on: each (expert matrix,
     * expert) an offloaded op reads from a host-resident expert matrix is a hit (already in the cache:
     * no upload) or a miss (uploaded, into the cache or the upload slots); bytes_cache_saved are the
     * hits' bytes. moe_context_get_expert_cache_layers splits them per layer. */
    uint64_t n_cache_hits;
    uint64_t n_cache_misses;
    uint64_t bytes_cache_saved;
    /* The offload thresholds in effect per moe_offload_op (the moe_sched_policy min_batch an op with
     * host-resident weights is offloaded from, as moe_context_get_policy resolves it) and where each came
     * from, a moe_threshold_source. docs/POLICY.md gives the formula of the measured ones. */
    int32_t offload_min_batch[MOE_OFFLOAD_OP_COUNT];
    int32_t offload_min_batch_source[MOE_OFFLOAD_OP_COUNT];
    /* What the measured thresholds were computed from (0 where nothing was measured): the host-to-device
     * copy bandwidth of the host-resident weights, GB/s (1e9 B/s); per moe_offload_op, the rates at which
     * the host and the device multiply weights by tokens, in GB/s of weight bytes times tokens (a weight
     * of W bytes applied to n tokens takes W * n / rate). */
    double offload_link_gbps;
    double offload_host_gbps[MOE_OFFLOAD_OP_COUNT];
    double offload_device_gbps[MOE_OFFLOAD_OP_COUNT];
    /* Contexts over several GPUs with weights in host RAM: of the weight bytes uploaded
     * (bytes_weights_full + bytes_weights_experts), those sent through another GPU's host link and then
     * the peer link (backend option upload_relay, docs/MULTI_GPU.md); the rest crossed the device's own. */
    uint64_t bytes_weights_relayed;
    /* The host's rate multiplying an expert weight by tokens at prompt sizes (256 tokens: the batched
     * kernels, AMX where the CPU has it), GB/s of weight bytes times tokens as offload_host_gbps; measured
     * with those (0 where nothing was); the expert split's first estimate of its host side (docs/POLICY.md). */
    double offload_host_prefill_gbps;
} moe_sched_stats;

/* Where an offload threshold (moe_sched_stats.offload_min_batch) came from. */
typedef enum moe_threshold_source {
    MOE_THRESHOLD_DEFAULT = 0,   /* the fixed default: 32 for mul_mat, 32 * n_expert / n_expert_used for the
                                  * expert ops (CPU and emulated contexts, offload_calibration=off, or nothing
                                  * of that op kind in host RAM to measure) */
    MOE_THRESHOLD_MEASURED = 1,  /* computed at context creation from the measured link bandwidth and the
                                  * host's and device's throughput on the op's weights */
    MOE_THRESHOLD_OVERRIDE = 2   /* the policy's explicit min_batch */
} moe_threshold_source;

/* "default", "measured", "override"; NULL for an unknown source. */
MOE_API const char* moe_threshold_source_name(int32_t source);

/* The fields of moe_sched_stats as X(type, name, dims) entries (dims: empty, or "[N]" for an array), for
 * code that handles every field alike (conversions, sums, printing). MOE_SCHED_STATS_COUNTERS lists
 * what the scheduler accumulates per ubatch (moe_context_reset_stats zeroes these);
 * MOE_SCHED_STATS_CONTEXT the figures of the context (placement, dimensions), which stay. Together
 * they are every field but struct_size; a field appended to the struct is appended to one of them. */
#define MOE_SCHED_STATS_COUNTERS(X)                      \
    X(uint64_t, n_ubatches, )                            \
    X(uint64_t, n_splits, )                              \
    X(uint64_t, bytes_weights_full, )                    \
    X(uint64_t, bytes_weights_experts, )                 \
    X(uint64_t, bytes_weights_skipped, )                 \
    X(uint64_t, bytes_activations, )                     \
    X(uint64_t, n_weight_copies, )                       \
    X(uint64_t, n_activation_copies, )                   \
    X(uint64_t, n_id_readbacks, )                        \
    X(uint64_t, n_offloaded, [MOE_OFFLOAD_OP_COUNT])     \
    X(uint64_t, n_kept_host, [MOE_OFFLOAD_OP_COUNT])     \
    X(uint64_t, n_ops_host, )                            \
    X(uint64_t, n_ops_device, )                          \
    X(double, seconds_total, )                           \
    X(double, seconds_host_compute, )                    \
    X(double, seconds_wait, )                            \
    X(double, seconds_device_submit, )                   \
    X(uint64_t, n_split_layers, )                        \
    X(uint64_t, n_split_host_experts, )                  \
    X(uint64_t, n_split_trials, )                        \
    X(uint64_t, bytes_between_devices, )                 \
    X(uint64_t, n_cache_hits, )                          \
    X(uint64_t, n_cache_misses, )                        \
    X(uint64_t, bytes_cache_saved, )                     \
    X(uint64_t, bytes_weights_relayed, )
#define MOE_SCHED_STATS_CONTEXT(X)                       \
    X(uint64_t, weights_host_bytes, )                    \
    X(uint64_t, weights_device_bytes, )                  \
    X(uint64_t, weights_host_pinned_bytes, )             \
    X(int32_t, n_layer, )                                \
    X(int32_t, n_expert, )                               \
    X(int32_t, offload_min_batch, [MOE_OFFLOAD_OP_COUNT])        \
    X(int32_t, offload_min_batch_source, [MOE_OFFLOAD_OP_COUNT]) \
    X(double, offload_link_gbps, )                               \
    X(double, offload_host_gbps, [MOE_OFFLOAD_OP_COUNT])         \
    X(double, offload_device_gbps, [MOE_OFFLOAD_OP_COUNT])       \
    X(double, offload_host_prefill_gbps, )

MOE_API moe_status moe_context_get_stats(const moe_context* ctx, moe_sched_stats* out_stats);

/* Per layer and expert: how many tokens selected the expert, as counts[layer * n_expert + expert].
 * `capacity` is the number of uint64_t in `counts`; *out_n receives n_layer * n_expert (call with
 * capacity 0 to size the array). */
MOE_API moe_status moe_context_get_expert_counts(const moe_context* ctx, uint64_t* counts, int64_t capacity,
                                                 int64_t* out_n);

/* Expert profiles: activation counts saved by one run and read by the next, so that under a VRAM budget
 * (moe_context_params.vram_budget, or the default one) the hottest experts of each layer stay in device
 * memory and the rest in host RAM. The file is text: a "moeinfer-expert-profile 1" line, the model's
 * arch, n_layer, n_expert and n_expert_used ("KEY VALUE" lines), then "layer L C0 C1 ..." per layer,
 * then "end" (the README's --expert-profile row).
 *
 * Writes the counts of moe_context_get_expert_counts (tokens since creation or the last
 * moe_context_reset_stats) to `path`, replacing it. IO_ERROR names the path; INVALID_ARGUMENT for a
 * model without experts. */
MOE_API moe_status moe_context_save_expert_profile(const moe_context* ctx, const char* path);

/* Writes `counts` (n = n_layer * n_expert values, laid out as moe_context_get_expert_counts', e.g. summed
 * over several contexts or runs) to `path` as the model's profile. INVALID_ARGUMENT for another n;
 * otherwise as moe_context_save_expert_profile. */
MOE_API moe_status moe_model_save_expert_profile(const moe_model* model, const uint64_t* counts, int64_t n,
                                                 const char* path);

/* Reads the profile at `path` into the model: contexts created afterwards place their experts by it
 * (those already created keep their placement). When the weights do not all fit the device, the expert
 * tensors that n_cpu_moe, n_gpu_layers and the overrides leave to the device are placed expert by
 * expert: hottest first, over all layers, while the budget lasts; a layer keeps its tensors whole in host
 * RAM and, in device memory, a slice holding its resident experts, whose part of each expert block the
 * device computes without an upload while the rest is computed as for host-resident experts. Without a
 * profile (NULL clears it) every expert is equally hot and layers fill whole, the last first.
 * NOT_FOUND when the file does not exist, DATA_CORRUPT naming the line of a malformed one, UNIMPLEMENTED
 * for another format version, INVALID_ARGUMENT naming the field (arch, n_layer, n_expert, n_expert_used)
 * when it was written for another model. The model is unchanged on error.
 * Thread safety: not while a context of the model is being created. */
MOE_API moe_status moe_model_set_expert_profile(moe_model* model, const char* path);

/* Per layer: the experts whose weights are in device memory (n_expert for a layer whose expert tensors
 * are all there, the resident ones of a partly resident layer, 0 for a layer whose experts are in host
 * RAM) and the device bytes they take (padded to 256 per tensor or slice). `capacity` entries of each
 * array; *out_n receives n_layer (call with capacity 0 to size the arrays). */
MOE_API moe_status moe_context_get_resident_experts(const moe_context* ctx, int32_t* n_experts, uint64_t* bytes,
                                                    int32_t capacity, int32_t* out_n);

/* Per layer, the expert cache's counts (moe_sched_stats.n_cache_hits, n_cache_misses, bytes_cache_saved
 * split by layer): hits[l], misses[l] and bytes_saved[l] for the layers l < min(n_layer, capacity). Each
 * array may be NULL (not written) when capacity is 0; *out_n receives n_layer. Zeroed by
 * moe_context_reset_stats. */
MOE_API moe_status moe_context_get_expert_cache_layers(const moe_context* ctx, uint64_t* hits, uint64_t* misses,
                                                       uint64_t* bytes_saved, int64_t capacity, int64_t* out_n);

/* Zeroes the statistics (placement figures stay), those of every device of the context. */
MOE_API moe_status moe_context_reset_stats(moe_context* ctx);

/* The devices a context computes on, in the order of its device list (device 0 holds the token
 * embeddings and is CUDA0 of the tensor overrides). A context over one device, and a CPU context, has
 * one (index 0, the whole context). Where moe_context_params named no devices, these are the ones the
 * default chose (moe_context_params.devices says how). */
MOE_API moe_status moe_context_get_n_devices(const moe_context* ctx, int32_t* out_n_devices);

/* One device of a context. Zero it, set struct_size = sizeof(moe_device_info), then
 * moe_context_get_device_info fills the fields inside struct_size. */
typedef struct moe_device_info {
    uint32_t struct_size;
    int32_t kind;      /* a moe_device: MOE_DEVICE_CPU, MOE_DEVICE_CUDA or MOE_DEVICE_EMULATED */
    int32_t ordinal;   /* the backend's device ordinal (CUDA device number); 0 for a CPU context */
    int32_t n_layers;  /* model layers it holds (their weights, KV cache and ops) */
} moe_device_info;

/* Device `device_index` (0 .. moe_context_get_n_devices - 1) of the context. INVALID_ARGUMENT naming
 * the index when it is out of range, or out_info->struct_size when it is too small. */
MOE_API moe_status moe_context_get_device_info(const moe_context* ctx, int32_t device_index,
                                               moe_device_info* out_info);

/* The statistics of device `device_index` alone: the counters of its scheduler (the ops of its
 * layers, the uploads to it, the bytes between devices that it sent through host memory or received),
 * its placement figures (weights_host_bytes, weights_device_bytes and weights_host_pinned_bytes of
 * its layers' weights) and the offload thresholds in effect on it. Over a context's devices, every
 * counter and placement figure sums to moe_context_get_stats' but n_ubatches, which is there the most
 * any device ran; n_layer and n_expert are the model's. One device: index 0 gives moe_context_get_stats'
 * figures. INVALID_ARGUMENT naming the index when it is out of range, as moe_context_get_stats for
 * out_stats. */
MOE_API moe_status moe_context_get_device_stats(const moe_context* ctx, int32_t device_index,
                                                moe_sched_stats* out_stats);

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

/* One ubatch of the timeline (moe_context_get_timeline): when it ran and how its time split, as the host
 * sees it. Device work is asynchronous: what the device did (uploads, kernels) while the host had
 * nothing else to do shows as seconds_wait; t_end - t_start minus the three parts is the scheduler's
 * own work (planning, copies queued). */
typedef struct moe_ubatch_timing {
    int32_t n_tokens;
    int32_t ok;                     /* 1, or 0 when the ubatch failed part-way */
    double t_start;                 /* seconds since moe_context_set_timeline switched the record on */
    double t_end;
    double seconds_host_compute;    /* moe_sched_stats' counters over this ubatch */
    double seconds_device_submit;
    double seconds_wait;
    uint64_t bytes_weights;         /* weights uploaded (bytes_weights_full + bytes_weights_experts) */
    uint64_t bytes_activations;
} moe_ubatch_timing;

/* Records the last `capacity` ubatches from now on (0: off, the default), dropping what was recorded;
 * t_start / t_end count from this call. moe_context_reset_stats leaves the record alone. Costs two
 * snapshots of a few counters per ubatch and capacity * sizeof(moe_ubatch_timing) bytes.
 * INVALID_ARGUMENT for capacity < 0 or > 1048576. */
MOE_API moe_status moe_context_set_timeline(moe_context* ctx, int32_t capacity);

/* Copies up to `capacity` of the recorded ubatches, oldest first, into `entries`; *out_n gets the number
 * held (call with capacity 0 to size the array); *out_dropped (may be NULL) the ubatches recorded since
 * moe_context_set_timeline that the ring no longer holds. */
MOE_API moe_status moe_context_get_timeline(const moe_context* ctx, moe_ubatch_timing* entries, int32_t capacity,
                                            int32_t* out_n, uint64_t* out_dropped);

/* ---------------------------------------------------------------------------------------------
 * Synthetic models: valid GGUF files with real MoE shapes and random weights, for tests and
 * benchmarks (llama.cpp loads them too).
 * ------------------------------------------------------------------------------------------- */

typedef struct moe_synth_params {
    uint32_t struct_size;
    /* "qwen3moe", "gpt-oss", "glm4moe" or "deepseek2". Borrowed during the call. Default: "qwen3moe". */
    const char* architecture;
    /* Preset shape: "qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b", "glm-4.5-air", "glm-4.5", or "tiny"
     * (a few-KB model for unit tests; glm4moe also "tiny-air", without q/k norms). Shape fields below
     * that are > 0 override the preset. glm4moe files also hold the NextN layer converted GLM files
     * carry. deepseek2: "deepseek-v3", "kimi-k2", "deepseek-v2-lite", "tiny" (V3-like) and "tiny-lite"
     * (V2-like); n_layer below the preset's keeps its share of leading dense layers, at least one dense
     * and one MoE layer. Default: "qwen3-30b-a3b" for qwen3moe, "gpt-oss-20b" for gpt-oss, "glm-4.5-air"
     * for glm4moe, "deepseek-v3" for deepseek2. */
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
    /* Type of the expert tensors (a moe_type the CPU backend computes: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
     * Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K .. Q6_K, IQ4_XS). Default: -1 (preset: Q8_0 for qwen3moe, MXFP4 for
     * gpt-oss). */
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
    /* A mix of types by tensor role, as llama.cpp's quantisation presets make the files users run:
     * "q4_k_m", "q5_k_m", "q3_k_xl" (a stand-in for the dynamic Q3_K_XL files) or "iq4_xs"; `moeinfer-synth
     * --help` says which type each role gets. It sets every weight's type, so expert_type and dense_type
     * must stay -1; rows that are not whole super-blocks take llama.cpp's fallback types (Q4_K -> Q5_0,
     * Q5_K -> Q5_1, Q6_K -> Q8_0, Q3_K / IQ4_XS -> IQ4_NL). NULL: the experts are expert_type and the
     * other weights dense_type. Borrowed during the call. Default: NULL. */
    const char* recipe;
} moe_synth_params;

/* Fills defaults for `architecture` ("qwen3moe", "gpt-oss", "glm4moe" or "deepseek2"; NULL means
 * "qwen3moe"). */
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
     * the four copies between host memory and CUDA device 0; MOE_DEVICE_AUTO is MOE_DEVICE_CUDA where
     * a CUDA device is present, else MOE_DEVICE_CPU (result.bytes > 0 tells that the copies were
     * measured). Default: MOE_DEVICE_CPU. */
    int32_t device;
    /* Bytes per host<->device copy (each of the device, pinned and pageable buffers has this size).
     * At least 4096. Default: 1 GiB (1073741824). */
    uint64_t bytes;
    /* Bytes of the host buffer that host_read reads. 0 reads max(bytes, 2 GiB), many times any CPU's
     * last-level cache, so that caches do not inflate the figure; smaller explicit values (at least
     * 4096) are allowed, e.g. for quick tests, but then caches may. Default: 0. */
    uint64_t host_bytes;
    /* CPU threads reading the host buffer, 0..MOE_MAX_THREADS (0 = all available cores). Default: 0. */
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

/* ---------------------------------------------------------------------------------------------
 * Sampling: logits -> next token
 *
 *     moe_sampler_params sp;
 *     moe_sampler_params_init(&sp);
 *     sp.seed = 1234;                                  (the same tokens on every run; default: random)
 *     moe_sampler* smpl = NULL;
 *     moe_sampler_create(&sp, info.n_vocab, &smpl);
 *     moe_sampler_accept(smpl, prompt, n_prompt);      (the penalties count the prompt too)
 *     moe_decode(ctx, prompt, NULL, n_prompt, 0);
 *     for (i = 0; i < n_predict; ++i) {
 *         moe_get_logits(ctx, &logits, &n_rows, &n_vocab);
 *         moe_sampler_sample(smpl, logits, n_vocab, &tok);
 *         moe_sampler_accept(smpl, &tok, 1);
 *         moe_decode(ctx, &tok, NULL, 1, 0);
 *     }
 *     moe_sampler_free(smpl);
 *
 * The chain, in this order (llama.cpp's stages and defaults). Candidates start as every token id with
 * its logit; "probability" is the softmax of the logits over the candidates left at that step.
 *  1. Penalties, for each token that occurs c > 0 times among the last repeat_last_n accepted tokens:
 *     logit l becomes l / repeat_penalty when l > 0, else l * repeat_penalty; then
 *     l - (c * frequency_penalty + presence_penalty).
 *  2. Logit bias: each entry's bias is added to its token's logit (entries for one token add up).
 *     Candidates whose logit is now -inf are dropped (a bias of -INFINITY bans a token).
 *  3. Greedy, when temperature <= 0: only the highest logit stays (the lowest id among equal ones),
 *     with probability 1, and sampling it takes nothing from the PRNG. Steps 4-6 always keep the
 *     highest logit, so greedy skips them and step 7.
 *  4. Top-k: the top_k highest logits stay (among equal logits the lower ids). 0: off.
 *  5. Top-p: with probabilities at temperature 1, the fewest most probable candidates whose
 *     probabilities sum to at least top_p stay (at least min_keep). 1: off.
 *  6. Min-p: candidates whose probability is at least min_p times the highest one stay, i.e. those
 *     with logit >= max logit + ln(min_p); when fewer than min_keep do, the min_keep best. 0: off.
 *  7. Temperature: probabilities p = softmax(logit / temperature) over the candidates left.
 *  8. Draw: u = (x >> 11) * 2^-53 in [0, 1), where x is the next output of the mt19937_64 generator
 *     (the C++ standard's std::mt19937_64) seeded with `seed`; the token is the first candidate, in
 *     ascending id order, at which the running sum of p exceeds u * (the sum of all p). Each draw
 *     takes exactly one output, so the k-th draw since creation or reset uses the k-th output, and a
 *     seed gives the same tokens on every platform (barring a u within rounding of a boundary
 *     between two candidates, where libm's last bit can decide).
 *
 * Thread safety: use a sampler from one thread at a time; samplers are independent of each other
 * and of contexts.
 * ------------------------------------------------------------------------------------------- */

/* A sampler chain with its penalties' history and its PRNG. */
typedef struct moe_sampler moe_sampler;

/* moe_sampler_params.seed: draw a seed from the operating system at creation
 * (moe_sampler_get_seed then tells which, to reproduce the run). */
#define MOE_SAMPLER_SEED_RANDOM UINT64_MAX

/* One logit bias entry. */
typedef struct moe_logit_bias {
    int32_t token;  /* in [0, n_vocab), else OUT_OF_RANGE */
    float bias;     /* added to the token's logit: finite, or -INFINITY to ban the token */
} moe_logit_bias;

typedef struct moe_sampler_params {
    uint32_t struct_size;
    /* Divides the logits before the draw; <= 0: greedy. Finite. Default: 0.8. */
    float temperature;
    /* Keep the top_k most likely tokens; 0: off. >= 0. Default: 40. */
    int32_t top_k;
    /* Keep the most likely tokens up to a probability mass of top_p; in (0, 1], 1: off. Default: 0.95. */
    float top_p;
    /* Keep tokens at least min_p times as likely as the most likely one; in [0, 1], 0: off.
     * Default: 0.05. */
    float min_p;
    /* Top-p and min-p keep at least this many tokens (0 and 1 both mean one). >= 0. Default: 0. */
    int32_t min_keep;
    /* How many of the last accepted tokens the penalties look at; 0: none (penalties off), -1: every
     * token accepted since creation or reset. >= -1. Default: 64. */
    int32_t repeat_last_n;
    /* Repetition penalty (CTRL, with negative logits multiplied); 1: off. Finite, > 0. Default: 1.0. */
    float repeat_penalty;
    /* Subtracted from a logit once per occurrence of its token in the window; 0: off. Finite (negative
     * values encourage repetition). Default: 0. */
    float frequency_penalty;
    /* Subtracted once from the logit of every token that occurs in the window; 0: off. Finite.
     * Default: 0. */
    float presence_penalty;
    /* Number of entries in logit_bias. >= 0. Default: 0. */
    int32_t n_logit_bias;
    /* n_logit_bias entries (may be NULL when there are none). Copied by moe_sampler_create.
     * Default: NULL. */
    const moe_logit_bias* logit_bias;
    /* Seed of the PRNG, or MOE_SAMPLER_SEED_RANDOM. Default: MOE_SAMPLER_SEED_RANDOM. */
    uint64_t seed;
} moe_sampler_params;

MOE_API void moe_sampler_params_init(moe_sampler_params* params);

/* Creates a sampler for logits of n_vocab tokens. `params` may be NULL for defaults. On success
 * *out_sampler owns the sampler; free it with moe_sampler_free.
 * Errors: INVALID_ARGUMENT (n_vocab <= 0, a bad parameter: NaN or infinite temperature, top_p
 * outside (0, 1], ...; the message names the field), OUT_OF_RANGE (a logit bias token outside
 * [0, n_vocab)). */
MOE_API moe_status moe_sampler_create(const moe_sampler_params* params, int32_t n_vocab, moe_sampler** out_sampler);

/* Frees a sampler. NULL is a no-op. */
MOE_API void moe_sampler_free(moe_sampler* sampler);

/* Appends n_tokens tokens to the penalties' history (the prompt, then each token kept).
 * moe_sampler_sample does not: the caller decides what enters the sequence. n_tokens may be 0.
 * OUT_OF_RANGE (nothing appended) when a token is outside [0, n_vocab). */
MOE_API moe_status moe_sampler_accept(moe_sampler* sampler, const int32_t* tokens, int32_t n_tokens);

/* Runs the chain on logits[0, n_vocab) and draws the next token into *out_token.
 * n_vocab must equal the sampler's. Errors: INVALID_ARGUMENT (NULL pointer, n_vocab mismatch, a NaN
 * or +inf logit, every logit -inf after the penalties and logit bias). */
MOE_API moe_status moe_sampler_sample(moe_sampler* sampler, const float* logits, int32_t n_vocab, int32_t* out_token);

/* Runs the chain without drawing (the PRNG does not move) and reports the candidates left: their ids
 * and probabilities (step 7's p, summing to 1), most probable first (equal ones by ascending id).
 * Up to `capacity` entries are written to out_ids / out_probs (NULL when capacity is 0); *out_n gets
 * the number of candidates (call with capacity 0 to size the arrays). Errors as moe_sampler_sample. */
MOE_API moe_status moe_sampler_apply(moe_sampler* sampler, const float* logits, int32_t n_vocab, int32_t* out_ids,
                                     float* out_probs, int32_t capacity, int32_t* out_n);

/* Empties the history and re-seeds the PRNG with the same seed: the sampler draws as if just created. */
MOE_API moe_status moe_sampler_reset(moe_sampler* sampler);

/* The seed in use: params.seed, or the one drawn for MOE_SAMPLER_SEED_RANDOM. */
MOE_API moe_status moe_sampler_get_seed(const moe_sampler* sampler, uint64_t* out_seed);

/* ---------------------------------------------------------------------------------------------
 * Text: the model's own tokenizer (from its tokenizer.ggml.* metadata), detokenization, and
 * metadata arrays.
 *
 * Supported tokenizers: tokenizer.ggml.model "gpt2" (byte-level BPE) with tokenizer.ggml.pre
 * "default", "llama3" (also "llama-v3", "llama-bpe"), "glm4" (also "chatglm-bpe"), "qwen2" (also
 * "deepseek-r1-qwen"), "gpt-4o", "deepseek-v3" or "deepseek-llm"; and "llama" (SentencePiece-style,
 * with byte fallback). A model whose tokenizer is another one fails to load with
 * MOE_STATUS_UNIMPLEMENTED, the message naming it and listing these; malformed tokenizer metadata
 * fails the load with MOE_STATUS_DATA_CORRUPT naming the key. A model without tokenizer metadata
 * loads, and the calls below (but the metadata ones) return MOE_STATUS_FAILED_PRECONDITION.
 *
 * Output buffers: *out_n always receives the size the result needs (tokens or bytes). When
 * `capacity` is smaller, nothing is written and nothing changes (a detokenizer keeps its state): call
 * again with a buffer of *out_n. Call with capacity 0 (the buffer may then be NULL) to size it.
 * Text out is bytes, not NUL-terminated (text may contain NUL).
 *
 * Invalid UTF-8 in the input text is not an error: each byte that does not start a well-formed
 * sequence is a character of its own, split as U+FFFD would be, and encoded as its own byte (the
 * byte-level alphabet, or "<0xXX>" byte fallback), so detokenizing gives the input back. llama.cpp
 * replaces such bytes with U+FFFD instead.
 *
 * Thread safety: the tokenizer is part of the immutable model; any number of threads may call the
 * functions taking a model at once. A moe_detokenizer is used from one thread at a time.
 * ------------------------------------------------------------------------------------------- */

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
typedef enum moe_token_type {
    MOE_TOKEN_TYPE_UNDEFINED = 0,
    MOE_TOKEN_TYPE_NORMAL = 1,
    MOE_TOKEN_TYPE_UNKNOWN = 2,
    MOE_TOKEN_TYPE_CONTROL = 3,      /* "<|im_start|>", BOS, EOS: text only when asked for */
    MOE_TOKEN_TYPE_USER_DEFINED = 4, /* always matched in text, always rendered */
    MOE_TOKEN_TYPE_UNUSED = 5,
    MOE_TOKEN_TYPE_BYTE = 6          /* "<0x0A>": one byte */
} moe_token_type;

/* Text (text_len bytes; may hold NUL; NULL only with text_len 0) to tokens.
 * add_special (non-zero): add BOS / EOS where the model asks for them (tokenizer.ggml.add_bos_token,
 *   add_eos_token; defaults as llama.cpp: on for BOS with "llama" and "llama3", off otherwise).
 * parse_special (non-zero): text equal to a control token's text ("<|im_start|>") becomes that token;
 *   with 0 it is tokenized as ordinary text. User-defined tokens are always matched.
 * Writes up to `capacity` ids into `tokens` (see "Output buffers"); *out_n receives the count. */
MOE_API moe_status moe_tokenize(const moe_model* model, const char* text, size_t text_len, int32_t add_special,
                                int32_t parse_special, int32_t* tokens, int64_t capacity, int64_t* out_n);

/* The bytes one token stands for. A normal token gives its text (decoded from the byte-level alphabet,
 * or with SentencePiece's U+2581 as a space), a byte token its byte, a user-defined token its text;
 * control, unknown and unused tokens give their text when render_special is non-zero, else nothing.
 * A piece may be part of a UTF-8 character. MOE_STATUS_OUT_OF_RANGE for a token outside [0, n_tokens). */
MOE_API moe_status moe_token_to_piece(const moe_model* model, int32_t token, int32_t render_special, char* buf,
                                      int64_t capacity, int64_t* out_n);

/* Tokens to text: the pieces of all tokens, concatenated, except that a "llama" tokenizer that
 * prefixes a space (add_space_prefix) drops the first piece's leading space, as SentencePiece decodes.
 * The same as a fresh moe_detokenizer fed all tokens, then flushed. OUT_OF_RANGE (nothing written)
 * when a token is outside [0, n_tokens); the message names its position. */
MOE_API moe_status moe_detokenize(const moe_model* model, const int32_t* tokens, int64_t n_tokens,
                                  int32_t render_special, char* buf, int64_t capacity, int64_t* out_n);

/* Streaming detokenization, for tokens as they are generated: each feed returns only whole UTF-8
 * characters and keeps an unfinished one (a character whose bytes are split across tokens) for the
 * next call. Borrows the model, which must outlive it. Free with moe_detokenizer_free. */
typedef struct moe_detokenizer moe_detokenizer;

MOE_API moe_status moe_detokenizer_create(const moe_model* model, int32_t render_special, moe_detokenizer** out_detok);
MOE_API void moe_detokenizer_free(moe_detokenizer* detok);

/* Writes the text of `tokens` up to the last whole character (see "Output buffers": when capacity is
 * too small nothing is consumed). OUT_OF_RANGE when a token is outside [0, n_tokens). */
MOE_API moe_status moe_detokenizer_feed(moe_detokenizer* detok, const int32_t* tokens, int64_t n_tokens, char* buf,
                                        int64_t capacity, int64_t* out_n);

/* Writes the bytes kept back (an unfinished character, as it is: the stream ended inside it) and
 * starts a new stream. */
MOE_API moe_status moe_detokenizer_flush(moe_detokenizer* detok, char* buf, int64_t capacity, int64_t* out_n);

/* The vocabulary. Strings are borrowed from the model and valid until moe_model_free. Special ids
 * are -1 when the model has none. */
typedef struct moe_vocab_info {
    uint32_t struct_size;
    const char* model;        /* tokenizer.ggml.model: "gpt2" or "llama" */
    const char* pre;          /* tokenizer.ggml.pre ("default" when a gpt2 file has none); "" for "llama" */
    int32_t n_tokens;
    int32_t bos;
    int32_t eos;
    int32_t eot;              /* end of turn */
    int32_t eom;              /* end of message */
    int32_t unk;
    int32_t pad;
    int32_t add_bos;          /* what moe_tokenize's add_special adds */
    int32_t add_eos;
    int32_t add_space_prefix; /* "llama": a space is put before the text */
    int32_t n_eog;            /* tokens that end generation (see moe_token_is_eog) */
} moe_vocab_info;

MOE_API void moe_vocab_info_init(moe_vocab_info* info);
MOE_API moe_status moe_model_get_vocab_info(const moe_model* model, moe_vocab_info* out_info);

/* A token's text as the vocabulary stores it (byte-level or U+2581-escaped; NUL-terminated),
 * borrowed from the model. OUT_OF_RANGE for a token outside [0, n_tokens). */
MOE_API moe_status moe_token_get_text(const moe_model* model, int32_t token, const char** out_text);

/* A token's moe_token_type. OUT_OF_RANGE for a token outside [0, n_tokens). */
MOE_API moe_status moe_token_get_type(const moe_model* model, int32_t token, int32_t* out_type);

/* *out_is_eog = 1 when the token ends generation: EOS, EOT, EOM, and the tokens whose text ends a
 * turn in the chat formats ("<|im_end|>", "<|eot_id|>", "<|return|>", "<|call|>", "<|endoftext|>",
 * "<|end|>", ...), else 0. OUT_OF_RANGE for a token outside [0, n_tokens). */
MOE_API moe_status moe_token_is_eog(const moe_model* model, int32_t token, int32_t* out_is_eog);

/* Metadata value types, numbered as GGUF's. */
typedef enum moe_meta_type {
    MOE_META_UINT8 = 0,
    MOE_META_INT8 = 1,
    MOE_META_UINT16 = 2,
    MOE_META_INT16 = 3,
    MOE_META_UINT32 = 4,
    MOE_META_INT32 = 5,
    MOE_META_FLOAT32 = 6,
    MOE_META_BOOL = 7,
    MOE_META_STRING = 8,
    MOE_META_ARRAY = 9,
    MOE_META_UINT64 = 10,
    MOE_META_INT64 = 11,
    MOE_META_FLOAT64 = 12
} moe_meta_type;

/* The type of the value at `key` (a moe_meta_type). For an array, *out_elem_type is its elements'
 * type and *out_n their count; for a scalar they are -1 and 1. out_elem_type and out_n may be NULL.
 * MOE_STATUS_NOT_FOUND when the key is absent. */
MOE_API moe_status moe_model_meta_type(const moe_model* model, const char* key, int32_t* out_type,
                                       int32_t* out_elem_type, int64_t* out_n);

/* The elements of an array of integers (any width, bool) as int64, or of numbers (floats and integers)
 * as double (see "Output buffers"). NOT_FOUND when the key is absent, INVALID_ARGUMENT when it is not
 * such an array (nested arrays are not read by these). */
MOE_API moe_status moe_model_meta_array_int(const moe_model* model, const char* key, int64_t* values,
                                            int64_t capacity, int64_t* out_n);
MOE_API moe_status moe_model_meta_array_float(const moe_model* model, const char* key, double* values,
                                              int64_t capacity, int64_t* out_n);

/* Element `index` of an array of strings: borrowed from the model (NUL-terminated; *out_len, when
 * out_len is not NULL, gets its length in bytes, which counts any NUL inside). OUT_OF_RANGE for an
 * index outside [0, n). */
MOE_API moe_status moe_model_meta_array_string(const moe_model* model, const char* key, int64_t index,
                                               const char** out_value, uint64_t* out_len);

/* ---------------------------------------------------------------------------------------------
 * Chat templates: a conversation to the prompt text the model was trained on.
 *
 *     moe_chat_message msgs[2] = {{"system", "Be brief.", NULL}, {"user", "Hi!", NULL}};
 *     int64_t n = 0;
 *     moe_chat_apply_template(model, NULL, msgs, 2, 1, NULL, NULL, 0, &n);     (size it)
 *     char* prompt = malloc(n);
 *     moe_chat_apply_template(model, NULL, msgs, 2, 1, NULL, prompt, n, &n);
 *     moe_tokenize(model, prompt, n, 0, 1, ...);                   (parse_special: the markers are tokens)
 *
 * Built-in renderers, one per template family of the architectures moeinfer runs; each gives, byte for
 * byte, what jinja2 renders from the family's real template (as Hugging Face's apply_chat_template
 * runs it) for plain system / user / assistant messages:
 *   "chatml"       <|im_start|>role\ncontent<|im_end|>\n ... (templates with no reasoning markup and
 *                  no default system prompt of their own)
 *   "qwen3"        Qwen3: ChatML, reasoning of assistant turns after the last user message kept in
 *                  <think>\n...\n</think>\n\n, earlier turns stripped of it; enable_thinking 0 writes the
 *                  empty block <think>\n\n</think>\n\n after the generation prompt
 *   "gpt-oss"      OpenAI harmony: the system message (model identity, knowledge cutoff, current date,
 *                  reasoning effort, channels), a first system/developer message as developer
 *                  instructions, final-channel turns; both published revisions of the template
 *   "deepseek-v3", "deepseek-r1"   <｜User｜> / <｜Assistant｜> turns after BOS and the system prompt;
 *                  R1 keeps only the text after </think> of earlier turns and opens <think>\n
 *   "glm4.5"       [gMASK]<sop><|system|>/<|user|>/<|assistant|> with <think></think> blocks;
 *                  enable_thinking 0 appends /nothink to user turns
 * The family is detected from the template text (its markers: <|im_start|>; <|start|> with <|channel|>;
 * <｜Assistant｜>; [gMASK]<sop>) unless moe_chat_params.template_name names one. A template none of
 * them matches is MOE_STATUS_UNIMPLEMENTED, the message listing the families and how to choose one.
 * Tools, tool calls and tool results are not rendered by the built-in renderers (a "tool" role is
 * INVALID_ARGUMENT): the Python package renders any template, tools included, with jinja2
 * (moeinfer.chat_template.render, Model.apply_chat_template).
 *
 * Output follows the "Output buffers" rule of the Text section (*out_n always gets the size needed;
 * nothing is written when capacity is smaller). The text is UTF-8, not NUL-terminated.
 * Thread safety: no shared state; any number of threads may call these at once.
 * ------------------------------------------------------------------------------------------- */

/* One message. Strings are NUL-terminated UTF-8, borrowed during the call. */
typedef struct moe_chat_message {
    const char* role;      /* "system", "user", "assistant" ("developer" as the first gpt-oss message) */
    const char* content;   /* may be "", not NULL */
    /* The assistant's reasoning, as Hugging Face's reasoning_content / thinking field (the
     * templates keep or drop it as they do reasoning inside content). NULL: none. */
    const char* reasoning;
} moe_chat_message;

typedef struct moe_chat_params {
    uint32_t struct_size;
    /* A built-in renderer by name ("chatml", "qwen3", "gpt-oss", "deepseek-v3", "deepseek-r1",
     * "glm4.5"), overriding detection. NULL: detected from the template. Default: NULL. */
    const char* template_name;
    /* The template's enable_thinking variable: -1 leaves it undefined (the template's default:
     * thinking on), 0 false, 1 true. Default: -1. */
    int32_t enable_thinking;
    /* gpt-oss: the reasoning_effort variable ("low", "medium", "high"). NULL: undefined (the
     * template writes "medium"). Default: NULL. */
    const char* reasoning_effort;
    /* gpt-oss: the model_identity variable, the system message's first line. NULL: undefined (the
     * template's "You are ChatGPT, a large language model trained by OpenAI."). Default: NULL. */
    const char* model_identity;
    /* gpt-oss: the "Current date:" text. NULL: today in local time as YYYY-MM-DD, as the template's
     * strftime_now("%Y-%m-%d"). Default: NULL. */
    const char* date;
    /* The bos_token variable (DeepSeek templates start with it). NULL: the model's BOS token text,
     * or "<｜begin▁of▁sentence｜>" without a model. Default: NULL. */
    const char* bos_token;
} moe_chat_params;

/* Fills the defaults above. */
MOE_API void moe_chat_params_init(moe_chat_params* params);

/* Renders n_messages messages with the chat template `template_text` (NUL-terminated), or, when it
 * is NULL, the model's tokenizer.chat_template; model may be NULL when template_text is given (or
 * params->template_name names the renderer). add_generation_prompt (non-zero) ends the text with the
 * header of an assistant turn for the model to complete. params may be NULL for defaults.
 * Errors: INVALID_ARGUMENT (no messages, a NULL role or content, a role the renderer does not write,
 * naming the message; an unknown template_name; content the template itself refuses, with the
 * template's message), NOT_FOUND (template_text NULL and the model has no tokenizer.chat_template),
 * UNIMPLEMENTED (no built-in renderer for the template). */
MOE_API moe_status moe_chat_apply_template(const moe_model* model, const char* template_text,
                                           const moe_chat_message* messages, int64_t n_messages,
                                           int32_t add_generation_prompt, const moe_chat_params* params, char* buf,
                                           int64_t capacity, int64_t* out_n);

/* The built-in renderer a template text selects: *out_name gets its name (static storage).
 * UNIMPLEMENTED (the message says why and lists the families) when none matches. */
MOE_API moe_status moe_chat_template_detect(const char* template_text, const char** out_name);

/* ---------------------------------------------------------------------------------------------
 * Generation
 *
 * moe_generate runs the decode loop over a prompt: it decodes the prompt (reusing the part of the
 * context's KV cache that the prompt starts with), then samples, streams and decodes tokens until an
 * end-of-generation token, a stop string, max_tokens, the callback or a full context ends it.
 * Thread safety: as moe_decode (one call at a time per context and per sampler).
 * ------------------------------------------------------------------------------------------- */

/* Receives each piece of generated text (UTF-8, whole characters, `len` bytes, not NUL-terminated;
 * borrowed during the call). Returns non-zero to go on, 0 to stop the generation. */
typedef int (*moe_piece_fn)(const char* text, size_t len, void* user_data);

/* Why a generation ended. */
typedef enum moe_stop_reason {
    MOE_STOP_MAX_TOKENS = 0,   /* max_tokens tokens were generated */
    MOE_STOP_EOG = 1,          /* the model drew an end-of-generation token (see moe_token_is_eog) */
    MOE_STOP_STRING = 2,       /* the text reached a stop string */
    MOE_STOP_CALLBACK = 3,     /* on_piece returned 0 */
    MOE_STOP_CONTEXT_FULL = 4  /* the KV cache holds n_ctx tokens */
} moe_stop_reason;

typedef struct moe_generate_params {
    uint32_t struct_size;
    /* Most tokens to generate. >= 0 (0: the prompt is decoded, nothing is generated). Default: 128. */
    int32_t max_tokens;
    /* n_stop NUL-terminated, non-empty UTF-8 strings: the generation stops after the first token with
     * which the text contains one of them, and the text is cut where the earliest of those starts (the
     * stop string and what follows are not passed to on_piece). Text that may begin a stop string is
     * held back until it is known not to. Borrowed during the call. Default: NULL, 0. */
    const char* const* stop;
    int32_t n_stop;
    /* Called with each piece of text (may be NULL). Default: NULL. */
    moe_piece_fn on_piece;
    void* user_data;
    /* Non-zero: control tokens are rendered as their text. Default: 0. */
    int32_t render_special;
    /* Optional output of the generated ids (the end-of-generation token excluded): the first
     * min(n_generated, tokens_capacity) are written. Default: NULL, 0. */
    int32_t* tokens;
    int32_t tokens_capacity;
} moe_generate_params;

/* Fills the defaults above. */
MOE_API void moe_generate_params_init(moe_generate_params* params);

typedef struct moe_generate_result {
    uint32_t struct_size;
    int32_t n_prompt_reused;  /* prompt tokens found in the KV cache and not decoded again */
    int32_t n_prompt_decoded; /* prompt tokens decoded (n_prompt - n_prompt_reused) */
    int32_t n_generated;      /* tokens generated (the end-of-generation token excluded) */
    int32_t stop_reason;      /* moe_stop_reason */
    double t_prompt_s;        /* seconds decoding the prompt */
    double t_gen_s;           /* seconds generating (sampling, decoding, the callback) */
} moe_generate_result;

MOE_API void moe_generate_result_init(moe_generate_result* result);

/* Generates after the n_prompt tokens of `prompt` (n_prompt >= 1).
 * Prefix reuse: the context remembers the ids in its KV cache; the longest common prefix of those and
 * the prompt is kept and only the rest is decoded (at least the prompt's last token, for its logits;
 * a rewind as moe_decode's positions allow). Calling moe_decode or moe_kv_clear in between is fine.
 * sampler: NULL draws greedily (the largest logit, the lowest id among equal ones); otherwise the
 * sampler draws each token, and moe_generate accepts into it the prompt tokens it decodes and each
 * token generated (so a sampler kept across calls follows the sequence in the cache).
 * After the call the cache holds the prompt and the generated tokens but the last one (the loop
 * stops before decoding it); a next prompt that extends the text reuses all of that.
 * params may be NULL for defaults; out_result may be NULL.
 * Errors: INVALID_ARGUMENT (NULL ctx or prompt, n_prompt < 1, max_tokens < 0, n_stop < 0, a NULL or
 * empty stop string, naming its index; tokens_capacity < 0), OUT_OF_RANGE (a prompt token outside
 * the vocabulary, or a prompt longer than n_ctx), FAILED_PRECONDITION (the model has no tokenizer),
 * and moe_decode's and the sampler's errors. Tokens generated before an error were passed to
 * on_piece; out_result is filled on errors too. */
MOE_API moe_status moe_generate(moe_context* ctx, const int32_t* prompt, int32_t n_prompt, moe_sampler* sampler,
                                const moe_generate_params* params, moe_generate_result* out_result);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEINFER_H */
