#include "runtime/model.h"

namespace moe {

StatusOr<std::unique_ptr<moe_model>> load_model(const std::string& path, const moe_model_params& params) {
    auto report = [&](float fraction) -> Status {
        if (params.progress != nullptr && params.progress(fraction, params.progress_user_data) == 0) {
            return cancelled("model load cancelled by the progress callback");
        }
        return Status::ok();
    };
    MOE_RETURN_IF_ERROR(report(0.0f));

    auto model = std::make_unique<moe_model>();
    model->path = path;
    // Reading the file in (use_mmap = 0) is the long part; parsing the header after it is quick.
    StatusOr<std::unique_ptr<GgufFile>> file =
        GgufFile::open(path, params.use_mmap != 0, [&](double f) { return report(static_cast<float>(f)); });
    if (!file.is_ok()) return file.status();  // GgufFile::open's messages name the path already
    model->file = std::move(file).value();

    StatusOr<HParams> hp = read_hparams(*model->file);
    if (!hp.is_ok()) return hp.status().with_context(path);
    model->hparams = std::move(hp).value();

    // The tokenizer is built here, once, so that an unsupported or malformed one fails the load
    // with its key named, and tokenizing needs no lock.
    StatusOr<std::unique_ptr<text::Vocab>> vocab = text::Vocab::from_gguf(*model->file);
    if (!vocab.is_ok()) return vocab.status().with_context(path);
    model->vocab = std::move(vocab).value();

    for (const GgufTensorInfo& t : model->file->tensors()) {
        model->n_bytes += t.n_bytes;
        // The experts of the layers run: glm4moe's NextN layers hold experts that are never loaded.
        if (is_expert_tensor_name(t.name) && tensor_layer(t.name) < model->hparams.n_layer) {
            model->n_expert_bytes += t.n_bytes;
        }
    }
    MOE_RETURN_IF_ERROR(report(1.0f));
    return model;
}

StatusOr<const std::vector<DerivedWeight>*> derived_weights(moe_model& model) {
    std::lock_guard<std::mutex> lock(model.derived_mu);
    if (!model.derived_made) {
        MOE_ASSIGN_OR_RETURN(std::vector<DerivedWeight> derived, split_kv_b(model.hparams, *model.file));
        MOE_ASSIGN_OR_RETURN(std::vector<DerivedWeight> joined, join_kv_b(model.hparams, *model.file));
        for (DerivedWeight& w : joined) derived.push_back(std::move(w));
        model.derived = std::move(derived);  // only once both are made: an error keeps nothing
        model.derived_made = true;
    }
    return &model.derived;
}

}  // namespace moe
