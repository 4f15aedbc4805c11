// Test helpers for the Arrow plugin: a small Arrow builder (random columns of
// every supported format, in host or device memory, with release callbacks
// that only count), a downloader that mirrors a received array in host
// memory, and a row-by-row logical comparison (so that compacted columns
// compare equal to the sliced originals).
#pragma once

#include <atomic>
#include <functional>
#include <random>

#include "host/common.hpp"

#include <gser/arrow.h>

namespace arrowtest {

// Calls of the input's release callbacks: gser borrows the input and must
// never call them.
inline std::atomic<int> &input_releases()
{
    static std::atomic<int> n{0};
    return n;
}
inline void count_schema_release(ArrowSchema *) { input_releases()++; }
inline void count_array_release(ArrowArray *) { input_releases()++; }

// Layout facts the tests need (mirrors the plugin's parser on purpose
// independently, for the formats the tests build).
struct Layout {
    enum Kind { Null, Bool, Fixed, Varlen, List, FixedList, Struct } kind = Null;
    int width = 0;         // Fixed: bytes; Varlen/List: offset bytes
    int64_t list_size = 0; // FixedList
    int n_buffers = 0;
};

inline Layout layout_of(const std::string &f)
{
    Layout l;
    auto fixed = [&](int w) { l.kind = Layout::Fixed; l.width = w; l.n_buffers = 2; return l; };
    if (f == "n") return l;
    if (f == "b") { l.kind = Layout::Bool; l.n_buffers = 2; return l; }
    if (f == "c" || f == "C") return fixed(1);
    if (f == "s" || f == "S" || f == "e") return fixed(2);
    if (f == "i" || f == "I" || f == "f" || f == "tdD" || f == "tts" || f == "ttm" || f == "tiM") return fixed(4);
    if (f == "l" || f == "L" || f == "g" || f == "tdm" || f == "ttu" || f == "ttn" || f.rfind("tD", 0) == 0 ||
        f.rfind("ts", 0) == 0 || f == "tiD")
        return fixed(8);
    if (f == "tin") return fixed(16);
    if (f.rfind("d:", 0) == 0) {
        size_t c2 = f.find(',', f.find(',') + 1);
        int bits = c2 == std::string::npos ? 128 : std::stoi(f.substr(c2 + 1));
        return fixed(bits / 8);
    }
    if (f.rfind("w:", 0) == 0) return fixed(std::stoi(f.substr(2)));
    if (f == "u" || f == "z") { l.kind = Layout::Varlen; l.width = 4; l.n_buffers = 3; return l; }
    if (f == "U" || f == "Z") { l.kind = Layout::Varlen; l.width = 8; l.n_buffers = 3; return l; }
    if (f == "+l" || f == "+m") { l.kind = Layout::List; l.width = 4; l.n_buffers = 2; return l; }
    if (f == "+L") { l.kind = Layout::List; l.width = 8; l.n_buffers = 2; return l; }
    if (f.rfind("+w:", 0) == 0) { l.kind = Layout::FixedList; l.list_size = std::stoll(f.substr(3)); l.n_buffers = 1; return l; }
    if (f == "+s") { l.kind = Layout::Struct; l.n_buffers = 1; return l; }
    l.n_buffers = 2; // unsupported formats in the tests: shaped like a fixed-width type
    l.kind = Layout::Fixed;
    l.width = 4;
    return l;
}

// A type to generate: format, name, children, dictionary.
struct Spec {
    std::string format;
    std::string name;
    std::vector<Spec> children;
    std::shared_ptr<Spec> dictionary;
    std::string metadata; // raw Arrow metadata bytes; empty = none
    int64_t flags = ARROW_FLAG_NULLABLE;
};

inline Spec S(std::string format, std::string name = "", std::vector<Spec> children = {})
{
    Spec s;
    s.format = std::move(format);
    s.name = std::move(name);
    s.children = std::move(children);
    return s;
}

inline Spec Dict(std::string index_format, Spec dict, std::string name = "")
{
    Spec s = S(std::move(index_format), std::move(name));
    s.dictionary = std::make_shared<Spec>(std::move(dict));
    return s;
}

// Arrow metadata bytes for key/value pairs.
inline std::string metadata(const std::vector<std::pair<std::string, std::string>> &kv)
{
    std::string out;
    auto i32 = [&](int32_t v) { out.append(reinterpret_cast<const char *>(&v), 4); };
    i32((int32_t)kv.size());
    for (auto &p : kv) {
        i32((int32_t)p.first.size());
        out += p.first;
        i32((int32_t)p.second.size());
        out += p.second;
    }
    return out;
}

// One node of an Arrow array (+ its schema) whose memory the test owns. The
// exported structs point into it; their release callbacks only count.
struct Node {
    std::string format, name, meta;
    bool has_meta = false;
    int64_t flags = ARROW_FLAG_NULLABLE;
    int64_t length = 0, null_count = 0, offset = 0;
    std::vector<std::vector<uint8_t>> bufs; // host bytes
    std::vector<bool> buf_null;             // this buffer's pointer is NULL
    std::vector<std::unique_ptr<Node>> children;
    std::unique_ptr<Node> dictionary;

    // exported
    ArrowSchema schema{};
    ArrowArray array{};
    std::vector<const void *> ptrs;
    std::vector<ArrowSchema *> schema_children;
    std::vector<ArrowArray *> array_children;
    gser_context_t *dev_ctx = nullptr;
    std::vector<std::pair<void *, size_t>> dev_bufs;

    Node() = default;
    Node(const Node &) = delete;
    Node &operator=(const Node &) = delete;
    ~Node()
    {
        for (auto &d : dev_bufs)
            gser_device_free(dev_ctx, d.first, d.second, nullptr);
    }
    Layout layout() const { return layout_of(format); }

    bool is_valid(int64_t row) const
    {
        if (layout().kind == Layout::Null)
            return false;
        if (bufs.empty() || buf_null[0] || bufs[0].empty())
            return true;
        int64_t b = offset + row;
        return (bufs[0][(size_t)(b / 8)] >> (b % 8)) & 1;
    }
    int64_t offset_at(int64_t i) const // offsets[i] (physical index)
    {
        const uint8_t *p = bufs[1].data() + (size_t)i * layout().width;
        if (layout().width == 4) {
            int32_t v;
            std::memcpy(&v, p, 4);
            return v;
        }
        int64_t v;
        std::memcpy(&v, p, 8);
        return v;
    }
    int64_t count_nulls(int64_t off, int64_t len) const
    {
        if (layout().kind == Layout::Null)
            return len;
        int64_t n = 0;
        for (int64_t r = 0; r < len; r++) {
            int64_t b = off + r;
            if (!bufs.empty() && !buf_null[0] && !bufs[0].empty() && !((bufs[0][(size_t)(b / 8)] >> (b % 8)) & 1))
                n++;
        }
        return n;
    }
    // Slice this (root) node: rows [off, off + len) of what it holds now.
    void slice(int64_t off, int64_t len)
    {
        offset += off;
        length = len;
        null_count = count_nulls(offset, length);
    }

    // Fill the exported structs; device != NONE puts every buffer in device memory.
    void finish(gser_context_t *ctx = nullptr, bool device = false)
    {
        for (auto &c : children)
            c->finish(ctx, device);
        if (dictionary)
            dictionary->finish(ctx, device);
        ptrs.assign(bufs.size(), nullptr);
        for (size_t b = 0; b < bufs.size(); b++) {
            if (buf_null[b])
                continue;
            const void *p = bufs[b].data();
            if (device) {
                void *d = nullptr;
                size_t n = bufs[b].size();
                EXPECT_EQ(gser_device_alloc(ctx, n ? n : 1, nullptr, &d), GSER_OK);
                if (n) {
                    EXPECT_EQ(gser_device_memcpy(ctx, d, GSER_MEMORY_DEVICE, bufs[b].data(), GSER_MEMORY_HOST, n,
                                                 nullptr),
                              GSER_OK);
                }
                dev_ctx = ctx;
                dev_bufs.emplace_back(d, n ? n : 1);
                p = d;
            } else if (bufs[b].empty()) {
                static const uint64_t empty = 0;
                p = &empty; // a non-NULL pointer to nothing
            }
            ptrs[b] = p;
        }
        if (device) {
            EXPECT_EQ(gser_stream_wait(ctx, nullptr), GSER_OK);
        }
        schema_children.clear();
        array_children.clear();
        for (auto &c : children) {
            schema_children.push_back(&c->schema);
            array_children.push_back(&c->array);
        }
        schema = ArrowSchema{};
        schema.format = format.c_str();
        schema.name = name.c_str();
        schema.metadata = has_meta ? meta.data() : nullptr;
        schema.flags = flags;
        schema.n_children = (int64_t)children.size();
        schema.children = children.empty() ? nullptr : schema_children.data();
        schema.dictionary = dictionary ? &dictionary->schema : nullptr;
        schema.release = count_schema_release;
        array = ArrowArray{};
        array.length = length;
        array.null_count = null_count;
        array.offset = offset;
        array.n_buffers = (int64_t)bufs.size();
        array.n_children = (int64_t)children.size();
        array.buffers = ptrs.empty() ? nullptr : ptrs.data();
        array.children = children.empty() ? nullptr : array_children.data();
        array.dictionary = dictionary ? &dictionary->array : nullptr;
        array.release = count_array_release;
    }
};

struct GenOptions {
    double null_p = 0;        // probability of a null per row (0: no validity bitmap)
    bool child_offsets = false; // give children offsets of their own (rows in front)
    uint32_t seed = 1;
};

class Gen {
  public:
    explicit Gen(GenOptions o) : o_(o), rng_(o.seed) {}

    std::unique_ptr<Node> make(const Spec &s, int64_t rows, bool is_child = false)
    {
        auto n = std::make_unique<Node>();
        n->format = s.format;
        n->name = s.name;
        n->flags = s.flags;
        if (!s.metadata.empty()) {
            n->meta = s.metadata;
            n->has_meta = true;
        }
        int64_t lead = is_child && o_.child_offsets ? (int64_t)(rng_() % 10) : 0;
        int64_t total = lead + rows;
        Layout l = n->layout();
        n->bufs.assign((size_t)l.n_buffers, {});
        n->buf_null.assign((size_t)l.n_buffers, false);
        if (l.kind != Layout::Null) {
            if (o_.null_p > 0) {
                n->bufs[0].assign((size_t)((total + 7) / 8), 0);
                for (int64_t r = 0; r < total; r++)
                    if (std::uniform_real_distribution<double>(0, 1)(rng_) >= o_.null_p)
                        n->bufs[0][(size_t)(r / 8)] |= (uint8_t)(1u << (r % 8));
            } else {
                n->buf_null[0] = true;
            }
        }
        switch (l.kind) {
        case Layout::Null: break;
        case Layout::Bool: n->bufs[1] = random_bytes((size_t)((total + 7) / 8)); break;
        case Layout::Fixed:
            if (s.dictionary) { // indices into the dictionary
                n->bufs[1].resize((size_t)(total * l.width));
                for (int64_t r = 0; r < total; r++) {
                    uint64_t v = rng_() % 7;
                    std::memcpy(&n->bufs[1][(size_t)(r * l.width)], &v, (size_t)l.width);
                }
            } else {
                n->bufs[1] = random_bytes((size_t)(total * l.width));
            }
            break;
        case Layout::Varlen:
        case Layout::List: {
            std::vector<int64_t> offs{0};
            for (int64_t r = 0; r < total; r++)
                offs.push_back(offs.back() + (int64_t)(rng_() % (l.kind == Layout::Varlen ? 9 : 4)));
            n->bufs[1].resize(offs.size() * (size_t)l.width);
            for (size_t k = 0; k < offs.size(); k++) {
                if (l.width == 4) {
                    int32_t v = (int32_t)offs[k];
                    std::memcpy(&n->bufs[1][k * 4], &v, 4);
                } else {
                    std::memcpy(&n->bufs[1][k * 8], &offs[k], 8);
                }
            }
            if (l.kind == Layout::Varlen)
                n->bufs[2] = random_bytes((size_t)offs.back());
            else
                n->children.push_back(make(s.children.at(0), offs.back(), true));
            break;
        }
        case Layout::FixedList: n->children.push_back(make(s.children.at(0), total * l.list_size, true)); break;
        case Layout::Struct:
            for (auto &c : s.children)
                n->children.push_back(make(c, total, true));
            break;
        }
        if (s.dictionary) {
            GenOptions keep = o_;
            o_.null_p = 0;
            n->dictionary = make(*s.dictionary, 7);
            o_ = keep;
        }
        n->offset = lead;
        n->length = rows;
        n->null_count = n->count_nulls(lead, rows);
        return n;
    }

    std::vector<uint8_t> random_bytes(size_t n)
    {
        std::vector<uint8_t> v(n);
        for (auto &b : v)
            b = (uint8_t)rng_();
        return v;
    }

  private:
    GenOptions o_;
    std::mt19937 rng_;
};

// A struct array (a table) of the given columns.
inline Spec table(std::vector<Spec> columns)
{
    Spec t = S("+s", "", std::move(columns));
    t.flags = 0;
    return t;
}

// ---- mirroring a received array into host memory ------------------------------------

inline std::vector<uint8_t> fetch(gser_context_t *ctx, const void *p, size_t n, bool device)
{
    std::vector<uint8_t> v(n);
    if (!n)
        return v;
    EXPECT_NE(p, nullptr);
    if (!p)
        return v;
    if (device) {
        EXPECT_EQ(gser_device_memcpy(ctx, v.data(), GSER_MEMORY_HOST, p, GSER_MEMORY_DEVICE, n, nullptr), GSER_OK);
        EXPECT_EQ(gser_stream_wait(ctx, nullptr), GSER_OK);
    } else {
        std::memcpy(v.data(), p, n);
    }
    return v;
}

// A host copy of (array, schema): the buffers' sizes follow from the layout.
inline std::unique_ptr<Node> mirror(gser_context_t *ctx, const ArrowArray *a, const ArrowSchema *s, bool device)
{
    auto n = std::make_unique<Node>();
    n->format = s->format;
    n->name = s->name ? s->name : "";
    n->flags = s->flags;
    n->length = a->length;
    n->null_count = a->null_count;
    n->offset = a->offset;
    Layout l = n->layout();
    EXPECT_EQ(a->n_buffers, l.n_buffers) << s->format;
    EXPECT_EQ(a->n_children, s->n_children) << s->format;
    n->bufs.assign((size_t)l.n_buffers, {});
    n->buf_null.assign((size_t)l.n_buffers, false);
    int64_t end = a->offset + a->length;
    for (int b = 0; b < l.n_buffers && b < a->n_buffers; b++) {
        size_t size = 0;
        if (b == 0 || l.kind == Layout::Bool)
            size = (size_t)((end + 7) / 8);
        else if (l.kind == Layout::Fixed)
            size = (size_t)(end * l.width);
        else if (b == 1)
            size = (size_t)((end + 1) * l.width);
        else
            size = (size_t)n->offset_at(end);
        if (!a->buffers[b]) {
            n->buf_null[(size_t)b] = true;
            continue;
        }
        n->bufs[(size_t)b] = fetch(ctx, a->buffers[b], size, device);
    }
    for (int64_t c = 0; c < a->n_children; c++)
        n->children.push_back(mirror(ctx, a->children[c], s->children[c], device));
    if (a->dictionary)
        n->dictionary = mirror(ctx, a->dictionary, s->dictionary, device);
    return n;
}

// ---- comparing logically ---------------------------------------------------------------------

// Rows [ra, ra + len) of a against rows [rb, rb + len) of b.
inline bool same_rows(const Node &a, int64_t ra, const Node &b, int64_t rb, int64_t len, const std::string &path)
{
    Layout l = a.layout();
    for (int64_t r = 0; r < len; r++) {
        bool va = a.is_valid(ra + r), vb = b.is_valid(rb + r);
        if (va != vb) {
            ADD_FAILURE() << path << ": row " << r << " valid " << va << " vs " << vb;
            return false;
        }
        int64_t pa = a.offset + ra + r, pb = b.offset + rb + r; // physical
        switch (l.kind) {
        case Layout::Null: break;
        case Layout::Bool:
            if (va && ((a.bufs[1][(size_t)(pa / 8)] >> (pa % 8)) & 1) != ((b.bufs[1][(size_t)(pb / 8)] >> (pb % 8)) & 1)) {
                ADD_FAILURE() << path << ": bool row " << r;
                return false;
            }
            break;
        case Layout::Fixed:
            if (a.dictionary) {
                auto idx = [&](const Node &n, int64_t p) {
                    uint64_t v = 0;
                    std::memcpy(&v, &n.bufs[1][(size_t)(p * l.width)], (size_t)l.width);
                    return (int64_t)v;
                };
                if (va && !same_rows(*a.dictionary, idx(a, pa), *b.dictionary, idx(b, pb), 1, path + ".<dict>"))
                    return false;
            } else if (va && std::memcmp(&a.bufs[1][(size_t)(pa * l.width)], &b.bufs[1][(size_t)(pb * l.width)],
                                         (size_t)l.width) != 0) {
                ADD_FAILURE() << path << ": value row " << r;
                return false;
            }
            break;
        case Layout::Varlen: {
            int64_t a0 = a.offset_at(pa), a1 = a.offset_at(pa + 1), b0 = b.offset_at(pb), b1 = b.offset_at(pb + 1);
            if (a1 - a0 != b1 - b0 ||
                (a1 > a0 && std::memcmp(&a.bufs[2][(size_t)a0], &b.bufs[2][(size_t)b0], (size_t)(a1 - a0)) != 0)) {
                ADD_FAILURE() << path << ": bytes of row " << r;
                return false;
            }
            break;
        }
        case Layout::List: {
            int64_t a0 = a.offset_at(pa), a1 = a.offset_at(pa + 1), b0 = b.offset_at(pb), b1 = b.offset_at(pb + 1);
            if (a1 - a0 != b1 - b0) {
                ADD_FAILURE() << path << ": list length of row " << r;
                return false;
            }
            if (!same_rows(*a.children[0], a0, *b.children[0], b0, a1 - a0, path + "[]"))
                return false;
            break;
        }
        case Layout::FixedList:
            if (!same_rows(*a.children[0], pa * l.list_size, *b.children[0], pb * l.list_size, l.list_size, path + "[]"))
                return false;
            break;
        case Layout::Struct:
            for (size_t c = 0; c < a.children.size(); c++)
                if (!same_rows(*a.children[c], a.offset + ra + r, *b.children[c], b.offset + rb + r, 1,
                               path + "." + (a.children[c]->name.empty() ? std::to_string(c) : a.children[c]->name)))
                    return false;
            break;
        }
    }
    return true;
}

// Schemas equal: formats, names, flags, metadata, children, dictionary.
inline bool same_schema(const Node &a, const ArrowSchema *b, const std::string &path)
{
    if (a.format != b->format || a.name != (b->name ? b->name : "") || a.flags != b->flags ||
        (int64_t)a.children.size() != b->n_children || !a.dictionary != !b->dictionary || a.has_meta != !!b->metadata) {
        ADD_FAILURE() << path << ": schema differs (" << a.format << " vs " << b->format << ", name \"" << a.name
                      << "\" vs \"" << (b->name ? b->name : "(null)") << "\")";
        return false;
    }
    if (a.has_meta && std::memcmp(a.meta.data(), b->metadata, a.meta.size()) != 0) {
        ADD_FAILURE() << path << ": metadata differs";
        return false;
    }
    for (size_t c = 0; c < a.children.size(); c++)
        if (!same_schema(*a.children[c], b->children[c], path + "." + a.children[c]->name))
            return false;
    return !a.dictionary || same_schema(*a.dictionary, b->dictionary, path + ".<dict>");
}

// Null counts: exact, also for parts of columns (the sender counts them).
inline void check_null_counts(const Node &sent, int64_t off, int64_t len, const Node &got, const std::string &path)
{
    int64_t want = sent.count_nulls(off, len);
    if (got.null_count != want)
        ADD_FAILURE() << path << ": null_count " << got.null_count << ", " << want << " expected";
    EXPECT_EQ(got.offset, 0) << path << ": compacted arrays start at offset 0";
}

} // namespace arrowtest
