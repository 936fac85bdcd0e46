#include "text/spm.h"

#include <queue>
#include <string>

#include "text/utf8.h"

namespace moe::text {

namespace {

struct Symbol {
    size_t begin;  // bytes of the text
    size_t len;    // 0 once merged into its left neighbour
    int32_t prev;
    int32_t next;
};

struct Candidate {
    float score;
    int32_t left;
    size_t len;  // of the merged text: the merge is stale when the sides changed since
    bool operator<(const Candidate& o) const { return score != o.score ? score < o.score : left > o.left; }
};

}  // namespace

void spm_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
    std::vector<Symbol> syms;
    for (size_t pos = 0; pos < text.size();) {
        const uint32_t len = utf8_decode(text, pos).len;
        const int32_t i = static_cast<int32_t>(syms.size());
        syms.push_back({pos, len, i - 1, pos + len < text.size() ? i + 1 : -1});
        pos += len;
    }
    std::priority_queue<Candidate> queue;
    auto consider = [&](int32_t left) {
        if (left < 0 || syms[static_cast<size_t>(left)].next < 0) return;
        const Symbol& l = syms[static_cast<size_t>(left)];
        const Symbol& r = syms[static_cast<size_t>(l.next)];
        const int32_t id = v.find(text.substr(l.begin, l.len + r.len));
        if (id != kNoToken) queue.push({v.score(id), left, l.len + r.len});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);
    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        Symbol& l = syms[static_cast<size_t>(c.left)];
        if (l.len == 0 || l.next < 0) continue;
        Symbol& r = syms[static_cast<size_t>(l.next)];
        if (l.len + r.len != c.len) continue;
        l.len += r.len;
        l.next = r.next;
        if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = c.left;
        r.len = 0;
        consider(l.prev);
        consider(c.left);
    }
    for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
        const Symbol& s = syms[static_cast<size_t>(i)];
        const std::string_view piece = text.substr(s.begin, s.len);
        const int32_t id = v.find(piece);
        if (id != kNoToken) {
            out.push_back(id);
            continue;
        }
        for (char ch : piece) {  // only single characters are left unmatched: a merge makes a token
            const int32_t b = v.byte_token(static_cast<uint8_t>(ch));
            if (b != kNoToken) {
                out.push_back(b);
            } else if (v.unk() != kNoToken) {
                out.push_back(v.unk());
                break;  // one unknown token per character, as sentencepiece without byte fallback
            }
        }
    }
}

}  // namespace moe::text
