// The released layouts of the public structs, frozen (STYLE: "freeze each released layout"). A field
// may only be appended at the end (callers built against an older header pass a smaller struct_size,
// see runtime/c_api_structs.h); moving or resizing one fails the build here. Offsets are those of the
// LP64 ABI the library is built and tested for (x86-64 Linux). When appending a field, add its line.
#include <cstddef>

#include "moeinfer/moeinfer.h"

static_assert(sizeof(void*) == 8, "the frozen layouts below are LP64's");

static_assert(offsetof(moe_model_params, struct_size) == 0);
static_assert(offsetof(moe_model_params, use_mmap) == 4);
static_assert(offsetof(moe_model_params, progress) == 8);
static_assert(offsetof(moe_model_params, progress_user_data) == 16);
static_assert(sizeof(moe_model_params) == 24);

static_assert(offsetof(moe_model_info, struct_size) == 0);
static_assert(offsetof(moe_model_info, architecture) == 8);
static_assert(offsetof(moe_model_info, name) == 16);
static_assert(offsetof(moe_model_info, n_layer) == 24);
static_assert(offsetof(moe_model_info, n_embd) == 28);
static_assert(offsetof(moe_model_info, n_vocab) == 32);
static_assert(offsetof(moe_model_info, n_head) == 36);
static_assert(offsetof(moe_model_info, n_head_kv) == 40);
static_assert(offsetof(moe_model_info, head_dim) == 44);
static_assert(offsetof(moe_model_info, n_expert) == 48);
static_assert(offsetof(moe_model_info, n_expert_used) == 52);
static_assert(offsetof(moe_model_info, n_ff_expert) == 56);
static_assert(offsetof(moe_model_info, n_ctx_train) == 60);
static_assert(offsetof(moe_model_info, sliding_window) == 64);
static_assert(offsetof(moe_model_info, n_tensors) == 68);
static_assert(offsetof(moe_model_info, n_bytes) == 72);
static_assert(offsetof(moe_model_info, n_expert_bytes) == 80);
static_assert(sizeof(moe_model_info) == 88);

static_assert(offsetof(moe_tensor_info, struct_size) == 0);
static_assert(offsetof(moe_tensor_info, name) == 8);
static_assert(offsetof(moe_tensor_info, type) == 16);
static_assert(offsetof(moe_tensor_info, n_dims) == 20);
static_assert(offsetof(moe_tensor_info, ne) == 24);
static_assert(offsetof(moe_tensor_info, n_bytes) == 56);
static_assert(offsetof(moe_tensor_info, file_offset) == 64);
static_assert(sizeof(moe_tensor_info) == 72);

static_assert(offsetof(moe_offload_rule, enabled) == 0);
static_assert(offsetof(moe_offload_rule, min_batch) == 4);
static_assert(sizeof(moe_offload_rule) == 8);

static_assert(offsetof(moe_sched_policy, struct_size) == 0);
static_assert(offsetof(moe_sched_policy, offload) == 4);
static_assert(offsetof(moe_sched_policy, expert_copy) == 28);
static_assert(offsetof(moe_sched_policy, bias_dup) == 32);
static_assert(offsetof(moe_sched_policy, offload_vram_budget) == 40);
static_assert(offsetof(moe_sched_policy, expert_split) == 48);
static_assert(offsetof(moe_sched_policy, expert_cache) == 56);
static_assert(sizeof(moe_sched_policy) == 64);

static_assert(offsetof(moe_context_params, struct_size) == 0);
static_assert(offsetof(moe_context_params, n_ctx) == 4);
static_assert(offsetof(moe_context_params, n_ubatch) == 8);
static_assert(offsetof(moe_context_params, n_threads) == 12);
static_assert(offsetof(moe_context_params, device) == 16);
static_assert(offsetof(moe_context_params, tensor_overrides) == 24);
static_assert(offsetof(moe_context_params, n_cpu_moe) == 32);
static_assert(offsetof(moe_context_params, n_gpu_layers) == 36);
static_assert(offsetof(moe_context_params, vram_budget) == 40);
static_assert(offsetof(moe_context_params, policy) == 48);
static_assert(offsetof(moe_context_params, progress) == 56);
static_assert(offsetof(moe_context_params, progress_user_data) == 64);
static_assert(offsetof(moe_context_params, devices) == 72);
static_assert(offsetof(moe_context_params, n_devices) == 80);
static_assert(offsetof(moe_context_params, split_mode) == 84);
static_assert(offsetof(moe_context_params, tensor_split) == 88);
static_assert(offsetof(moe_context_params, n_tensor_split) == 96);
static_assert(offsetof(moe_context_params, main_gpu) == 100);
static_assert(offsetof(moe_context_params, vram_budgets) == 104);
static_assert(offsetof(moe_context_params, n_vram_budgets) == 112);
static_assert(offsetof(moe_context_params, backend_options) == 120);
static_assert(sizeof(moe_context_params) == 128);

static_assert(offsetof(moe_sched_stats, struct_size) == 0);
static_assert(offsetof(moe_sched_stats, n_ubatches) == 8);
static_assert(offsetof(moe_sched_stats, n_splits) == 16);
static_assert(offsetof(moe_sched_stats, bytes_weights_full) == 24);
static_assert(offsetof(moe_sched_stats, bytes_weights_experts) == 32);
static_assert(offsetof(moe_sched_stats, bytes_weights_skipped) == 40);
static_assert(offsetof(moe_sched_stats, bytes_activations) == 48);
static_assert(offsetof(moe_sched_stats, n_weight_copies) == 56);
static_assert(offsetof(moe_sched_stats, n_activation_copies) == 64);
static_assert(offsetof(moe_sched_stats, n_id_readbacks) == 72);
static_assert(offsetof(moe_sched_stats, n_offloaded) == 80);
static_assert(offsetof(moe_sched_stats, n_kept_host) == 104);
static_assert(offsetof(moe_sched_stats, n_ops_host) == 128);
static_assert(offsetof(moe_sched_stats, n_ops_device) == 136);
static_assert(offsetof(moe_sched_stats, seconds_total) == 144);
static_assert(offsetof(moe_sched_stats, seconds_host_compute) == 152);
static_assert(offsetof(moe_sched_stats, seconds_wait) == 160);
static_assert(offsetof(moe_sched_stats, weights_host_bytes) == 168);
static_assert(offsetof(moe_sched_stats, weights_device_bytes) == 176);
static_assert(offsetof(moe_sched_stats, n_layer) == 184);
static_assert(offsetof(moe_sched_stats, n_expert) == 188);
static_assert(offsetof(moe_sched_stats, seconds_device_submit) == 192);
static_assert(offsetof(moe_sched_stats, n_split_layers) == 200);
static_assert(offsetof(moe_sched_stats, n_split_host_experts) == 208);
static_assert(offsetof(moe_sched_stats, n_split_trials) == 216);
static_assert(offsetof(moe_sched_stats, weights_host_pinned_bytes) == 224);
static_assert(offsetof(moe_sched_stats, bytes_between_devices) == 232);
static_assert(offsetof(moe_sched_stats, n_cache_hits) == 240);
static_assert(offsetof(moe_sched_stats, n_cache_misses) == 248);
static_assert(offsetof(moe_sched_stats, bytes_cache_saved) == 256);
static_assert(offsetof(moe_sched_stats, offload_min_batch) == 264);
static_assert(offsetof(moe_sched_stats, offload_min_batch_source) == 276);
static_assert(offsetof(moe_sched_stats, offload_link_gbps) == 288);
static_assert(offsetof(moe_sched_stats, offload_host_gbps) == 296);
static_assert(offsetof(moe_sched_stats, offload_device_gbps) == 320);
static_assert(offsetof(moe_sched_stats, bytes_weights_relayed) == 344);
static_assert(offsetof(moe_sched_stats, offload_host_prefill_gbps) == 352);
static_assert(sizeof(moe_sched_stats) == 360);
// The field lists (MOE_SCHED_STATS_COUNTERS / _CONTEXT) name every field but struct_size (and its padding):
// a field appended to the struct but to neither list fails here.
#define MOE_FIELD_BYTES(type, name, dims) +sizeof(((moe_sched_stats*)nullptr)->name)
static_assert(offsetof(moe_sched_stats, n_ubatches) MOE_SCHED_STATS_COUNTERS(MOE_FIELD_BYTES)
                  MOE_SCHED_STATS_CONTEXT(MOE_FIELD_BYTES) == sizeof(moe_sched_stats));
#undef MOE_FIELD_BYTES

static_assert(offsetof(moe_op_profile, op) == 0);
static_assert(offsetof(moe_op_profile, backend) == 8);
static_assert(offsetof(moe_op_profile, count) == 16);
static_assert(offsetof(moe_op_profile, seconds) == 24);
static_assert(sizeof(moe_op_profile) == 32);

static_assert(offsetof(moe_ubatch_timing, n_tokens) == 0);
static_assert(offsetof(moe_ubatch_timing, ok) == 4);
static_assert(offsetof(moe_ubatch_timing, t_start) == 8);
static_assert(offsetof(moe_ubatch_timing, t_end) == 16);
static_assert(offsetof(moe_ubatch_timing, seconds_host_compute) == 24);
static_assert(offsetof(moe_ubatch_timing, seconds_device_submit) == 32);
static_assert(offsetof(moe_ubatch_timing, seconds_wait) == 40);
static_assert(offsetof(moe_ubatch_timing, bytes_weights) == 48);
static_assert(offsetof(moe_ubatch_timing, bytes_activations) == 56);
static_assert(sizeof(moe_ubatch_timing) == 64);

static_assert(offsetof(moe_synth_params, struct_size) == 0);
static_assert(offsetof(moe_synth_params, architecture) == 8);
static_assert(offsetof(moe_synth_params, preset) == 16);
static_assert(offsetof(moe_synth_params, n_layer) == 24);
static_assert(offsetof(moe_synth_params, n_embd) == 28);
static_assert(offsetof(moe_synth_params, n_vocab) == 32);
static_assert(offsetof(moe_synth_params, n_head) == 36);
static_assert(offsetof(moe_synth_params, n_head_kv) == 40);
static_assert(offsetof(moe_synth_params, head_dim) == 44);
static_assert(offsetof(moe_synth_params, n_expert) == 48);
static_assert(offsetof(moe_synth_params, n_expert_used) == 52);
static_assert(offsetof(moe_synth_params, n_ff_expert) == 56);
static_assert(offsetof(moe_synth_params, expert_type) == 60);
static_assert(offsetof(moe_synth_params, dense_type) == 64);
static_assert(offsetof(moe_synth_params, seed) == 72);
static_assert(offsetof(moe_synth_params, routing_skew) == 80);
static_assert(offsetof(moe_synth_params, progress) == 88);
static_assert(offsetof(moe_synth_params, progress_user_data) == 96);
static_assert(offsetof(moe_synth_params, recipe) == 104);
static_assert(sizeof(moe_synth_params) == 112);

static_assert(offsetof(moe_bandwidth_params, struct_size) == 0);
static_assert(offsetof(moe_bandwidth_params, device) == 4);
static_assert(offsetof(moe_bandwidth_params, bytes) == 8);
static_assert(offsetof(moe_bandwidth_params, host_bytes) == 16);
static_assert(offsetof(moe_bandwidth_params, n_threads) == 24);
static_assert(offsetof(moe_bandwidth_params, repetitions) == 28);
static_assert(sizeof(moe_bandwidth_params) == 32);

static_assert(offsetof(moe_bandwidth_result, struct_size) == 0);
static_assert(offsetof(moe_bandwidth_result, h2d_pinned) == 8);
static_assert(offsetof(moe_bandwidth_result, h2d_pageable) == 16);
static_assert(offsetof(moe_bandwidth_result, d2h_pinned) == 24);
static_assert(offsetof(moe_bandwidth_result, d2h_pageable) == 32);
static_assert(offsetof(moe_bandwidth_result, host_read) == 40);
static_assert(offsetof(moe_bandwidth_result, bytes) == 48);
static_assert(offsetof(moe_bandwidth_result, host_bytes) == 56);
static_assert(offsetof(moe_bandwidth_result, n_threads) == 64);
static_assert(offsetof(moe_bandwidth_result, repetitions) == 68);
static_assert(sizeof(moe_bandwidth_result) == 72);

static_assert(offsetof(moe_logit_bias, token) == 0);
static_assert(offsetof(moe_logit_bias, bias) == 4);
static_assert(sizeof(moe_logit_bias) == 8);

static_assert(offsetof(moe_sampler_params, struct_size) == 0);
static_assert(offsetof(moe_sampler_params, temperature) == 4);
static_assert(offsetof(moe_sampler_params, top_k) == 8);
static_assert(offsetof(moe_sampler_params, top_p) == 12);
static_assert(offsetof(moe_sampler_params, min_p) == 16);
static_assert(offsetof(moe_sampler_params, min_keep) == 20);
static_assert(offsetof(moe_sampler_params, repeat_last_n) == 24);
static_assert(offsetof(moe_sampler_params, repeat_penalty) == 28);
static_assert(offsetof(moe_sampler_params, frequency_penalty) == 32);
static_assert(offsetof(moe_sampler_params, presence_penalty) == 36);
static_assert(offsetof(moe_sampler_params, n_logit_bias) == 40);
static_assert(offsetof(moe_sampler_params, logit_bias) == 48);
static_assert(offsetof(moe_sampler_params, seed) == 56);
static_assert(sizeof(moe_sampler_params) == 64);

static_assert(offsetof(moe_vocab_info, struct_size) == 0);
static_assert(offsetof(moe_vocab_info, model) == 8);
static_assert(offsetof(moe_vocab_info, pre) == 16);
static_assert(offsetof(moe_vocab_info, n_tokens) == 24);
static_assert(offsetof(moe_vocab_info, bos) == 28);
static_assert(offsetof(moe_vocab_info, eos) == 32);
static_assert(offsetof(moe_vocab_info, eot) == 36);
static_assert(offsetof(moe_vocab_info, eom) == 40);
static_assert(offsetof(moe_vocab_info, unk) == 44);
static_assert(offsetof(moe_vocab_info, pad) == 48);
static_assert(offsetof(moe_vocab_info, add_bos) == 52);
static_assert(offsetof(moe_vocab_info, add_eos) == 56);
static_assert(offsetof(moe_vocab_info, add_space_prefix) == 60);
static_assert(offsetof(moe_vocab_info, n_eog) == 64);
static_assert(sizeof(moe_vocab_info) == 72);

// An array element, not a params struct: it has no struct_size and can never grow.
static_assert(offsetof(moe_chat_message, role) == 0);
static_assert(offsetof(moe_chat_message, content) == 8);
static_assert(offsetof(moe_chat_message, reasoning) == 16);
static_assert(sizeof(moe_chat_message) == 24);

static_assert(offsetof(moe_chat_params, struct_size) == 0);
static_assert(offsetof(moe_chat_params, template_name) == 8);
static_assert(offsetof(moe_chat_params, enable_thinking) == 16);
static_assert(offsetof(moe_chat_params, reasoning_effort) == 24);
static_assert(offsetof(moe_chat_params, model_identity) == 32);
static_assert(offsetof(moe_chat_params, date) == 40);
static_assert(offsetof(moe_chat_params, bos_token) == 48);
static_assert(sizeof(moe_chat_params) == 56);

static_assert(offsetof(moe_generate_params, struct_size) == 0);
static_assert(offsetof(moe_generate_params, max_tokens) == 4);
static_assert(offsetof(moe_generate_params, stop) == 8);
static_assert(offsetof(moe_generate_params, n_stop) == 16);
static_assert(offsetof(moe_generate_params, on_piece) == 24);
static_assert(offsetof(moe_generate_params, user_data) == 32);
static_assert(offsetof(moe_generate_params, render_special) == 40);
static_assert(offsetof(moe_generate_params, tokens) == 48);
static_assert(offsetof(moe_generate_params, tokens_capacity) == 56);
static_assert(sizeof(moe_generate_params) == 64);

static_assert(offsetof(moe_generate_result, struct_size) == 0);
static_assert(offsetof(moe_generate_result, n_prompt_reused) == 4);
static_assert(offsetof(moe_generate_result, n_prompt_decoded) == 8);
static_assert(offsetof(moe_generate_result, n_generated) == 12);
static_assert(offsetof(moe_generate_result, stop_reason) == 16);
static_assert(offsetof(moe_generate_result, t_prompt_s) == 24);
static_assert(offsetof(moe_generate_result, t_gen_s) == 32);
static_assert(sizeof(moe_generate_result) == 40);

static_assert(offsetof(moe_device_info, struct_size) == 0);
static_assert(offsetof(moe_device_info, kind) == 4);
static_assert(offsetof(moe_device_info, ordinal) == 8);
static_assert(offsetof(moe_device_info, n_layers) == 12);
static_assert(sizeof(moe_device_info) == 16);
