// moeinfer.Model's tokenizer methods and moeinfer.Detokenizer: text in, text out, through the C API's
// "Text" section.
#include <string>
#include <vector>

#include "bindings.h"

namespace moeinfer_py {

using namespace pybind11::literals;

namespace {

// str -> its UTF-8 bytes; bytes / bytearray as they are (any bytes, invalid UTF-8 included).
std::string text_bytes(const py::handle& text) {
    if (py::isinstance<py::str>(text)) return text.cast<std::string>();
    if (py::isinstance<py::bytes>(text) || py::isinstance<py::bytearray>(text)) {
        return std::string(py::bytes(py::reinterpret_borrow<py::object>(text)));
    }
    throw py::type_error("text must be str or bytes, not " + std::string(py::str(py::type::of(text).attr("__name__"))));
}

py::str decode(const std::string& bytes, const char* errors) {
    return py::reinterpret_steal<py::str>(
        py::handle(PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), errors)));
}

py::str checked_decode(const std::string& bytes, const char* errors) {
    py::str s = decode(bytes, errors);
    if (!s) throw py::error_already_set();
    return s;
}

py::dict vocab_dict(const moeinfer::Model& m) {
    const moe_vocab_info v = m.vocab_info();
    return py::dict("model"_a = v.model, "pre"_a = v.pre, "n_tokens"_a = v.n_tokens, "bos"_a = v.bos,
                    "eos"_a = v.eos, "eot"_a = v.eot, "eom"_a = v.eom, "unk"_a = v.unk, "pad"_a = v.pad,
                    "add_bos"_a = v.add_bos != 0, "add_eos"_a = v.add_eos != 0,
                    "add_space_prefix"_a = v.add_space_prefix != 0, "n_eog"_a = v.n_eog);
}

}  // namespace

void bind_text(py::module_& m) {
    auto model_cls = py::reinterpret_borrow<py::class_<moeinfer::Model>>(m.attr("Model"));
    model_cls
        .def(
            "tokenize",
            [](const moeinfer::Model& self, const py::object& text, bool add_special, bool parse_special) {
                const std::string bytes = text_bytes(text);
                py::gil_scoped_release release;
                return self.tokenize(bytes, add_special, parse_special);
            },
            "text"_a, "add_special"_a = true, "parse_special"_a = false,
            R"(Token ids of `text` (str, or bytes: any bytes, invalid UTF-8 included) by the model's own tokenizer.

add_special adds BOS/EOS where the model asks for them (see `vocab`); parse_special turns text equal
to a control token ("<|im_start|>") into that token (otherwise it is ordinary text). RuntimeError
when the model has no tokenizer.)")
        .def(
            "detokenize",
            [](const moeinfer::Model& self, const std::vector<int32_t>& tokens, bool render_special,
               const std::string& errors) {
                std::string bytes;
                {
                    py::gil_scoped_release release;
                    bytes = self.detokenize(tokens, render_special);
                }
                return checked_decode(bytes, errors.c_str());
            },
            "tokens"_a, "render_special"_a = false, "errors"_a = "replace",
            R"(The text of `tokens`, decoded from UTF-8 with `errors` ("replace", "strict", "surrogateescape", ...).

render_special gives control tokens their text (otherwise they vanish). ValueError for an id
outside the vocabulary. detokenize_bytes gives the bytes.)")
        .def(
            "detokenize_bytes",
            [](const moeinfer::Model& self, const std::vector<int32_t>& tokens, bool render_special) {
                std::string bytes;
                {
                    py::gil_scoped_release release;
                    bytes = self.detokenize(tokens, render_special);
                }
                return py::bytes(bytes);
            },
            "tokens"_a, "render_special"_a = false, "The bytes of `tokens` (see detokenize).")
        .def(
            "token_to_piece",
            [](const moeinfer::Model& self, int32_t token, bool render_special) {
                return py::bytes(self.token_to_piece(token, render_special));
            },
            "token"_a, "render_special"_a = false,
            "The bytes one token stands for (possibly part of a UTF-8 character).")
        .def(
            "token_text",
            [](const moeinfer::Model& self, int32_t token) {
                return checked_decode(self.token_text(token), "surrogateescape");
            },
            "token"_a, "The token's text as the vocabulary stores it (byte-level or U+2581-escaped).")
        .def("token_type", &moeinfer::Model::token_type, "token"_a,
             "The token's type: moeinfer.TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_BYTE, ... (GGUF numbering).")
        .def("is_eog", &moeinfer::Model::is_eog, "token"_a,
             "True when the token ends generation (EOS, EOT, EOM, \"<|im_end|>\", \"<|return|>\", ...).")
        .def_property_readonly("vocab", &vocab_dict,
                               "dict: model, pre, n_tokens, bos, eos, eot, eom, unk, pad (-1 when none), add_bos, "
                               "add_eos, add_space_prefix, n_eog. RuntimeError when the model has no tokenizer.");

    m.attr("TOKEN_UNDEFINED") = static_cast<int>(MOE_TOKEN_TYPE_UNDEFINED);
    m.attr("TOKEN_NORMAL") = static_cast<int>(MOE_TOKEN_TYPE_NORMAL);
    m.attr("TOKEN_UNKNOWN") = static_cast<int>(MOE_TOKEN_TYPE_UNKNOWN);
    m.attr("TOKEN_CONTROL") = static_cast<int>(MOE_TOKEN_TYPE_CONTROL);
    m.attr("TOKEN_USER_DEFINED") = static_cast<int>(MOE_TOKEN_TYPE_USER_DEFINED);
    m.attr("TOKEN_UNUSED") = static_cast<int>(MOE_TOKEN_TYPE_UNUSED);
    m.attr("TOKEN_BYTE") = static_cast<int>(MOE_TOKEN_TYPE_BYTE);

    py::class_<moeinfer::Detokenizer>(m, "Detokenizer",
                                      "Streaming detokenization: feed() returns whole characters only.")
        .def(py::init([](const moeinfer::Model& model, bool render_special) {
                 return moeinfer::Detokenizer(model, render_special);
             }),
             "model"_a, "render_special"_a = false, py::keep_alive<1, 2>(),
             "A detokenizer over `model`'s vocabulary (keeps the model alive).")
        .def(
            "feed",
            [](moeinfer::Detokenizer& self, const std::vector<int32_t>& tokens) {
                return checked_decode(self.feed(tokens), "strict");
            },
            "tokens"_a,
            "The text of `tokens` up to the last whole UTF-8 character; an unfinished one waits for the next call.")
        .def(
            "flush", [](moeinfer::Detokenizer& self) { return checked_decode(self.flush(), "replace"); },
            "What was held back (an unfinished character becomes U+FFFD), and a fresh stream.");
}

}  // namespace moeinfer_py
