#include "text/bpe.h"

#include <queue>
#include <string>

#include "text/byte_level.h"
#include "text/pretokenize.h"

namespace moe::text {

namespace {

struct Symbol {
    int32_t id;    // kNoToken: a byte the vocabulary lacks; it takes part in no merge
    int32_t prev;  // index of the neighbours in the word, -1 at the ends
    int32_t next;
};

struct Candidate {
    int32_t rank;
    int32_t left;      // symbol index
    int32_t left_id;   // ids when queued: a merge is stale once either side changed
    int32_t right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

}  // namespace

void bpe_encode_word(const Vocab& v, std::string_view word, std::vector<int32_t>& out) {
    if (word.empty()) return;
    if (v.ignore_merges()) {
        std::string mapped;
        byte_level_encode(word, mapped);
        const int32_t id = v.find(mapped);
        if (id != kNoToken) {
            out.push_back(id);
            return;
        }
    }
    const int32_t n = static_cast<int32_t>(word.size());
    std::vector<Symbol> syms(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        syms[static_cast<size_t>(i)] = {v.byte_token(static_cast<uint8_t>(word[static_cast<size_t>(i)])), i - 1,
                                        i + 1 < n ? i + 1 : -1};
    }
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    auto consider = [&](int32_t left) {
        if (left < 0) return;
        const Symbol& l = syms[static_cast<size_t>(left)];
        if (l.next < 0 || l.id == kNoToken) return;
        const Symbol& r = syms[static_cast<size_t>(l.next)];
        if (r.id == kNoToken) return;
        if (const Vocab::Merge* m = v.find_merge(l.id, r.id)) queue.push({m->rank, left, l.id, r.id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        Symbol& l = syms[static_cast<size_t>(c.left)];
        if (l.id != c.left_id || l.next < 0) continue;
        Symbol& r = syms[static_cast<size_t>(l.next)];
        if (r.id != c.right_id) continue;
        l.id = v.find_merge(l.id, r.id)->result;
        l.next = r.next;
        if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = c.left;
        r.id = kNoToken;
        r.prev = r.next = -2;  // removed
        consider(l.prev);
        consider(c.left);
    }
    for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
        const int32_t id = syms[static_cast<size_t>(i)].id;
        if (id != kNoToken) {
            out.push_back(id);
        } else if (v.unk() != kNoToken) {
            out.push_back(v.unk());
        }
    }
}

void bpe_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
    std::vector<std::string_view> words;
    pre_tokenize(v.pre(), text, words);
    for (std::string_view w : words) bpe_encode_word(v, w, out);
}

}  // namespace moe::text
