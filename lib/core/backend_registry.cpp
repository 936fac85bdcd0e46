#include "core/backend_registry.h"

#include <mutex>

namespace moe {
namespace {

std::vector<BackendFactory>& registry() {
    static std::vector<BackendFactory> factories;
    return factories;
}

std::once_flag g_builtin_once;

}  // namespace

void register_backend_factory(BackendFactory factory) { registry().push_back(std::move(factory)); }

const std::vector<BackendFactory>& backend_factories() {
    std::call_once(g_builtin_once, register_builtin_backends);
    return registry();
}

const BackendFactory* find_backend_factory(const std::string& name) {
    for (const BackendFactory& f : backend_factories()) {
        if (f.name == name) return &f;
    }
    return nullptr;
}

}  // namespace moe
