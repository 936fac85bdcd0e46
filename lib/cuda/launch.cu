#include "cuda/launch.cuh"

namespace moe::cuda {

namespace {
// Per thread: a backend drives its stream from one thread at a time, and each launch it makes (eager or
// captured into a graph) happens inside its own PdlScope.
thread_local bool t_pdl = false;
}  // namespace

bool pdl_launches() { return t_pdl; }

PdlScope::PdlScope(bool on) : prev_(t_pdl) { t_pdl = on; }

PdlScope::~PdlScope() { t_pdl = prev_; }

}  // namespace moe::cuda
