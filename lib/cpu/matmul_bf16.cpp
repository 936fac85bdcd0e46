// The BF16 path's driver (see matmul_bf16_path.h). Baseline x86-64: the arithmetic is in the kernel
// tables of matmul_bf16_avx512.cpp, matmul_bf16_amx.cpp (the tile product on AMX, where the CPU has it)
// and, for the super-block kinds, matmul_i8_avx512.cpp (int8 tiles), reached only where the CPU has
// AVX-512 BF16.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>

#include "cpu/cpu_features.h"
#include "cpu/matmul_bf16.h"
#include "cpu/matmul_bf16_path.h"
#include "cpu/matmul_i8.h"

namespace moe::cpu::bf16path {
namespace {

using mm::bf16::kBlockTokens;
using mm::bf16::kChunk;
using mm::bf16::kRows;
using mm::bf16::kTileCols;

constexpr int64_t kBlocksPerJob = kTileCols / kBlockTokens;
constexpr int64_t kMaxRowsPerJob = kMaxTileRows;
constexpr int64_t kJobsPerThread = 8;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

struct Job {
    int32_t expert;
    int32_t r0;
    int32_t b0;  // first block of the expert's group
    int32_t nb;
};

// The most blocks n_pairs pairs over n_expert experts can take: one partial block per active expert.
int64_t max_blocks(int64_t n_expert, int64_t n_pairs) { return n_pairs / kBlockTokens + std::min(n_expert, n_pairs); }

// Rows per job: 64, or fewer (multiples of kRows) until every thread has kJobsPerThread jobs.
int64_t rows_per_job(int64_t n_rows, int64_t col_jobs) {
    const int64_t want = kJobsPerThread * std::max(1, tbb::this_task_arena::max_concurrency());
    int64_t rb = kMaxRowsPerJob;
    while (rb > kRows && ceil_div(n_rows, rb) * col_jobs < want) rb /= 2;
    return rb;
}

}  // namespace

bool wanted(int kind, int64_t n_pairs, int64_t n_expert) {
    const CpuFeatures& f = cpu_features();
    const Bf16Path mode = bf16_path();
    if (!f.avx512_bf16 || mode == Bf16Path::kNever) return false;
    if (mm::bf16::kAvx512Bf16Kernels.decode[kind] == nullptr) return false;
    if (mode == Bf16Path::kAlways) return true;
    // Pairs per expert from which the BF16 path is the faster one, measured with moeinfer_bench_matmul
    // (Qwen3-30B-A3B expert shapes, one Zen 4 core: AVX-512 BF16, no AMX; the figures are in the
    // commits that set them). Q8_0, Q4_0, MXFP4, Q2_K and the other 32-element kinds: from 64
    // (their integer kernels are cheap per block). Q4_K and Q5_K (whose integer kernels unpack each
    // super-block for at most 4 tokens): from 16. Q3_K and IQ4_XS: from 32. Q6_K: from 32 with the int8
    // tiles (64 with the BF16 ones).
    int64_t min_pairs = 0;
    switch (kind) {
        case mm::kQ8_0:
        case mm::kQ4_0:
        case mm::kMXFP4:
        case mm::kQ4_1:
        case mm::kQ5_0:
        case mm::kQ5_1:
        case mm::kIQ4_NL:
        case mm::kQ2_K: min_pairs = 64; break;
        case mm::kQ6_K: min_pairs = decoded_tiles() == DecodedTiles::kInt8 ? 32 : 64; break;
        case mm::kQ3_K:
        case mm::kIQ4_XS: min_pairs = 32; break;
        case mm::kQ4_K:
        case mm::kQ5_K: min_pairs = 16; break;
        default: return false;
    }
    return n_pairs >= min_pairs * std::min(n_expert, n_pairs);
}

size_t scratch_bytes(int64_t k, int64_t n_rows, int64_t n_expert, int64_t n_pairs) {
    const int64_t blocks = max_blocks(n_expert, n_pairs);
    const int64_t jobs = ceil_div(n_rows, kRows) * blocks;  // rows per job >= kRows, >= 1 block per job
    return align64(static_cast<size_t>(blocks) * mm::bf16::act_block_bytes(k)) +
           align64(sizeof(int32_t) * static_cast<size_t>(n_expert + 1)) + align64(sizeof(Job) * static_cast<size_t>(jobs));
}

void run(const Problem& p, uint8_t* scratch) {
    const mm::bf16::Bf16Kernels& kt = mm::bf16::kAvx512Bf16Kernels;
    const mm::i8::I8Kernels& it = mm::i8::kAvx512I8Kernels;
    // The int8 tiles where every operand's kind has them (the super-block kinds, k % 256 == 0); the BF16
    // tiles otherwise, multiplied on AMX where the CPU has it. (AMX BF16 tiles, H100 host, 16 cores,
    // Qwen3-30B-A3B expert shapes, 4096 tokens: Q8_0 and Q4_0 3.1x the AVX-512 BF16 tiles, but Q4_K,
    // Q6_K and IQ4_XS 2-11% behind the int8 tiles, whose weights cost less to decode; PERF.md 2026-11-27.)
    const mm::bf16::TileFn bf16_tile = cpu_features().amx ? mm::bf16::amx_tile : kt.tile;
    bool i8 = cpu_features().avx512_vnni && decoded_tiles() == DecodedTiles::kInt8;
    for (int i = 0; i < p.n_w; ++i) i8 = i8 && it.decode[p.w[i].kind] != nullptr;
    const int64_t n_pairs = p.offsets[p.n_expert];
    const size_t block_bytes = i8 ? mm::i8::act_block_bytes(p.k) : mm::bf16::act_block_bytes(p.k);
    uint8_t* acts = scratch;
    auto* block_start = reinterpret_cast<int32_t*>(
        scratch + align64(static_cast<size_t>(max_blocks(p.n_expert, n_pairs)) * block_bytes));
    auto* jobs = reinterpret_cast<Job*>(reinterpret_cast<uint8_t*>(block_start) +
                                        align64(sizeof(int32_t) * static_cast<size_t>(p.n_expert + 1)));

    // Blocks of each expert's pairs, and the jobs over them.
    block_start[0] = 0;
    int64_t col_jobs = 0;
    for (int64_t e = 0; e < p.n_expert; ++e) {
        const int64_t nb = ceil_div(p.offsets[e + 1] - p.offsets[e], kBlockTokens);
        block_start[e + 1] = block_start[e] + static_cast<int32_t>(nb);
        col_jobs += ceil_div(nb, kBlocksPerJob);
    }
    const int64_t rb = rows_per_job(p.n_rows, col_jobs);
    int64_t n_jobs = 0;
    for (int64_t e = 0; e < p.n_expert; ++e) {
        const int64_t nb = block_start[e + 1] - block_start[e];
        for (int64_t r0 = 0; r0 < p.n_rows; r0 += rb) {
            for (int64_t b0 = 0; b0 < nb; b0 += kBlocksPerJob) {
                jobs[n_jobs++] = {static_cast<int32_t>(e), static_cast<int32_t>(r0), static_cast<int32_t>(b0),
                                  static_cast<int32_t>(std::min(kBlocksPerJob, nb - b0))};
            }
        }
    }

    // Activations, once: block j of expert e holds pairs offsets[e] + 16 j ...
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, p.n_expert, 1), [&](const tbb::blocked_range<int64_t>& er) {
        for (int64_t e = er.begin(); e < er.end(); ++e) {
            const int64_t cnt = p.offsets[e + 1] - p.offsets[e];
            tbb::parallel_for(tbb::blocked_range<int64_t>(0, ceil_div(cnt, kBlockTokens), 1),
                              [&](const tbb::blocked_range<int64_t>& br) {
                for (int64_t j = br.begin(); j < br.end(); ++j) {
                    const float* rows[kBlockTokens];
                    const int n = static_cast<int>(std::min(kBlockTokens, cnt - j * kBlockTokens));
                    for (int t = 0; t < n; ++t) {
                        const int64_t pair = p.offsets[e] + j * kBlockTokens + t;
                        rows[t] = p.act_row(p.act_idx ? p.act_idx[pair] : pair);
                    }
                    (i8 ? it.pack : kt.pack)(rows, n, p.k, acts + static_cast<size_t>(block_start[e] + j) * block_bytes);
                }
            });
        }
    });

    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_jobs, 1), [&](const tbb::blocked_range<int64_t>& jr) {
        alignas(64) float acc[2][kMaxRowsPerJob * kTileCols];
        alignas(64) uint16_t wbuf[kRows * kChunk];  // BF16 weights, or int8 ones in its first half
        float wscales[kRows * mm::i8::kChunkBlocks];
        auto* wbuf8 = reinterpret_cast<uint8_t*>(wbuf);
        for (int64_t j = jr.begin(); j < jr.end(); ++j) {
            const Job& job = jobs[j];
            const int64_t nr = std::min(rb, p.n_rows - job.r0);
            const uint8_t* job_acts = acts + static_cast<size_t>(block_start[job.expert] + job.b0) * block_bytes;
            // Row groups outer, chunks inner: each weight row is read front to back in one go (the
            // decoders prefetch the next chunk), while the job's activations stay in L2.
            for (int64_t rg = 0; rg < nr; rg += kRows) {
                const int n = static_cast<int>(std::min<int64_t>(kRows, nr - rg));
                for (int i = 0; i < p.n_w; ++i) {
                    const Operand& w = p.w[i];
                    const uint8_t* rows = w.data + job.expert * w.expert_stride + (job.r0 + rg) * w.row_stride;
                    for (int64_t k0 = 0; k0 < p.k; k0 += kChunk) {
                        const int64_t kc = std::min(kChunk, p.k - k0);
                        if (i8) {
                            it.decode[w.kind](rows, w.row_stride, n, k0, kc, wbuf8, wscales);
                            it.tile(wbuf8, wscales, n, p.k, k0, kc, job_acts, job.nb, acc[i] + rg * kTileCols, k0 == 0);
                        } else {
                            kt.decode[w.kind](rows, w.row_stride, n, k0, kc, wbuf);
                            bf16_tile(wbuf, n, kc, job_acts + k0 / 2 * 64, block_bytes, job.nb,
                                      acc[i] + rg * kTileCols, k0 == 0);
                        }
                    }
                }
            }
            const int64_t first = p.offsets[job.expert] + job.b0 * kBlockTokens;
            const int64_t nc = std::min<int64_t>(job.nb * kBlockTokens, p.offsets[job.expert + 1] - first);
            p.store(Tile{job.expert, job.r0, nr, first, nc, {acc[0], acc[1]}, kTileCols});
        }
    });
}

}  // namespace moe::cpu::bf16path
