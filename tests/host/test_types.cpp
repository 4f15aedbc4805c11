// Types, families, dispatch, pass-through, versions, and threads.
#include <atomic>
#include <thread>

#include "host/common.hpp"

namespace {

const char *const kDeviceHost[] = {"device", "host"};
const char *const kHostDevice[] = {"host", "device"};

// {"tasks": [nil, nil, nil, {"payload": <blob>}], "buf": <1 KiB buffer>}
struct TaskMsg {
    MsgPtr msg;
    Blob blob;
    std::vector<double> side;
};

void build_task_msg(gser_context_t *ctx, TaskMsg &t, int64_t id = 7)
{
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    t.msg.reset(m);
    t.blob.id = id;
    t.blob.name = "blob-" + std::to_string(id);
    t.blob.data.assign(512, 0.0);
    for (size_t i = 0; i < t.blob.data.size(); i++)
        t.blob.data[i] = (double)i * 1.25 + (double)id;
    t.side.assign(128, 3.0);
    gser_value_t *root, *tasks, *task, *obj, *buf;
    ASSERT_EQ(gser_msg_new_map(m, &root), GSER_OK);
    ASSERT_EQ(gser_msg_new_list(m, &tasks), GSER_OK);
    for (int i = 0; i < 3; i++)
        gser_list_append_nil(tasks);
    ASSERT_EQ(gser_msg_new_map(m, &task), GSER_OK);
    ASSERT_EQ(gser_msg_new_object(m, "test.blob", &t.blob, &obj), GSER_OK) << gser_context_get_last_error(ctx);
    gser_map_put_cstr(task, "payload", obj);
    gser_list_append(tasks, task);
    gser_map_put_cstr(root, "tasks", tasks);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = t.side.data();
    d.nbytes = t.side.size() * sizeof(double);
    d.dtype = GSER_DTYPE_FLOAT64;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &buf), GSER_OK);
    gser_map_put_cstr(root, "buf", buf);
    gser_msg_set_root(m, root);
}

gser_value_t *payload_of(gser_msg_t *m)
{
    gser_value_t *tasks = nullptr, *task = nullptr, *payload = nullptr;
    EXPECT_EQ(gser_map_find_cstr(gser_msg_get_root(m), "tasks", &tasks), GSER_OK);
    EXPECT_EQ(gser_list_get(tasks, 3, &task), GSER_OK);
    EXPECT_EQ(gser_map_find_cstr(task, "payload", &payload), GSER_OK);
    return payload;
}

std::string error_of(gser_context_t *ctx)
{
    return gser_context_get_last_error(ctx);
}

} // namespace

TEST(Registry, RegistrationErrorsAreStatusesNotCrashes)
{
    auto ctx = make_ctx();
    gser_context_t *c = ctx.get();
    EXPECT_EQ(gser_type_register(c, "a.type", 1, nullptr), GSER_OK);
    EXPECT_EQ(gser_type_register(c, "a.type", 2, nullptr), GSER_ERR_EXISTS);
    EXPECT_NE(error_of(c).find("\"a.type\" is already registered"), std::string::npos) << error_of(c);
    EXPECT_EQ(gser_type_register(c, "", 1, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_type_register(c, nullptr, 1, nullptr), GSER_ERR_INVALID_ARG);
    gser_type_options_t bad = GSER_TYPE_OPTIONS_INIT;
    bad.min_read_version = 3;
    EXPECT_EQ(gser_type_register(c, "b.type", 2, &bad), GSER_ERR_INVALID_ARG);

    EXPECT_EQ(gser_type_add_family(c, "a.type", "host", blob_serialize, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_type_add_family(c, "a.type", "host", nullptr, blob_deserialize), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_type_add_family(c, "a.type", "nosuch", blob_serialize, blob_deserialize),
              GSER_ERR_UNKNOWN_FAMILY);
    EXPECT_NE(error_of(c).find("family \"nosuch\" is not registered"), std::string::npos) << error_of(c);
    EXPECT_EQ(gser_type_add_family(c, "missing", "host", blob_serialize, blob_deserialize), GSER_ERR_NOT_FOUND);
    EXPECT_EQ(gser_type_add_family(c, "a.type", "host", blob_serialize, blob_deserialize), GSER_OK);
    EXPECT_EQ(gser_type_add_family(c, "a.type", "host", blob_serialize, blob_deserialize), GSER_ERR_EXISTS);

    EXPECT_EQ(gser_family_register(c, "host"), GSER_ERR_EXISTS);
    EXPECT_EQ(gser_family_register(c, "a,b"), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_family_register(c, ""), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_family_register(c, std::string(64, 'x').c_str()), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_family_register(c, "arrow"), GSER_OK);
    int ok = 0;
    for (int i = 0; i < 40; i++) {
        std::string name = "fam" + std::to_string(i);
        if (gser_family_register(c, name.c_str()) == GSER_OK)
            ok++;
    }
    EXPECT_EQ(ok, 32 - 3) << "at most 32 families, device/host/arrow included";

    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_msg_create(c, &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *v;
    EXPECT_EQ(gser_msg_new_object(m, "not.registered", nullptr, &v), GSER_ERR_NOT_FOUND);
    gser_frames_t *f = nullptr;
    const char *const fams[] = {"host", "gpu"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = fams;
    so.nfamilies = 2;
    EXPECT_EQ(gser_serialize(c, m, &so, &f), GSER_ERR_UNKNOWN_FAMILY);
    EXPECT_NE(error_of(c).find("\"gpu\""), std::string::npos) << error_of(c);
    EXPECT_EQ(f, nullptr);

    // After first use the registry is frozen (it is read without locks).
    ASSERT_EQ(gser_serialize(c, m, nullptr, &f), GSER_OK);
    gser_frames_destroy(f);
    EXPECT_EQ(gser_type_register(c, "late.type", 1, nullptr), GSER_ERR_STATE);
    EXPECT_EQ(gser_family_register(c, "late"), GSER_ERR_STATE);
    EXPECT_EQ(gser_type_add_family(c, "a.type", "device", blob_serialize, blob_deserialize), GSER_ERR_STATE);
}

TEST(Dispatch, FirstFamilyInTheCallersOrderThatTheTypeSupports)
{
    struct Case {
        std::vector<const char *> registered;
        const char *const *order;
        const char *expect;
    } cases[] = {
        {{"host"}, kDeviceHost, "host"},     // falls back to host
        {{"device", "host"}, kDeviceHost, "device"},
        {{"device", "host"}, kHostDevice, "host"},
        {{"device"}, kHostDevice, "device"}, // falls forward to device
    };
    for (const Case &c : cases) {
        auto ctx = make_ctx();
        BlobStats stats;
        register_blob(ctx.get(), &stats, c.registered);
        TaskMsg t;
        build_task_msg(ctx.get(), t);
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.families = c.order;
        so.nfamilies = 2;
        auto frames = serialize(ctx.get(), t.msg.get(), &so);
        ASSERT_TRUE(frames);
        EXPECT_EQ(stats.serialized, 1);
        // The header records family, type and version.
        auto kept = deserialize(ctx.get(), frames.get(), GSER_DESERIALIZE_KEEP_SERIALIZED);
        gser_serialized_info_t info = GSER_SERIALIZED_INFO_INIT;
        ASSERT_EQ(gser_value_get_serialized(payload_of(kept.get()), &info), GSER_OK);
        EXPECT_STREQ(info.family, c.expect);
        EXPECT_STREQ(info.type_name, "test.blob");
        EXPECT_EQ(info.version, 1u);
        EXPECT_EQ(info.nframes, 1u) << "the blob's data buffer";
        EXPECT_EQ(stats.deserialized, 0) << "kept serialized: no type code ran";
        // And a plain deserialize rebuilds the object.
        auto back = deserialize(ctx.get(), frames.get());
        const char *tn;
        void *obj;
        ASSERT_EQ(gser_value_get_object(payload_of(back.get()), &tn, &obj), GSER_OK);
        EXPECT_STREQ(tn, "test.blob");
        auto *b = static_cast<Blob *>(obj);
        EXPECT_EQ(b->id, t.blob.id);
        EXPECT_EQ(b->name, t.blob.name);
        EXPECT_EQ(b->data, t.blob.data);
        EXPECT_EQ(stats.deserialized, 1);
        back.reset();
        EXPECT_EQ(stats.destroyed, 1) << "the message destroys what it deserialized";
    }
}

TEST(Dispatch, MissingSerializerNamesPathTypeAndFamilies)
{
    auto ctx = make_ctx();
    BlobStats stats;
    gser_context_t *c = ctx.get();
    ASSERT_EQ(gser_family_register(c, "arrow"), GSER_OK);
    register_blob(c, &stats, {"arrow"});
    TaskMsg t;
    build_task_msg(c, t);
    gser_frames_t *f = nullptr;
    EXPECT_EQ(gser_serialize(c, t.msg.get(), nullptr, &f), GSER_ERR_NO_SERIALIZER);
    EXPECT_EQ(f, nullptr);
    EXPECT_EQ(error_of(c), "$.tasks[3].payload: type \"test.blob\" has no serializer for families [device, host]");
}

TEST(Dispatch, SerializerAndDeserializerFailuresCarryThePath)
{
    auto ctx = make_ctx();
    BlobStats stats;
    register_blob(ctx.get(), &stats, {"host"});
    TaskMsg t;
    build_task_msg(ctx.get(), t, -5); // blob_serialize rejects negative ids
    gser_frames_t *f = nullptr;
    EXPECT_EQ(gser_serialize(ctx.get(), t.msg.get(), nullptr, &f), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(error_of(ctx.get()),
              "$.tasks[3].payload: type \"test.blob\", family \"host\": serializer failed: blob id -5 is negative");

    // A receiver whose deserializer rejects the tree.
    auto rx = make_ctx();
    gser_type_register(rx.get(), "test.blob", 1, nullptr);
    gser_type_add_family(
        rx.get(), "test.blob", "host", blob_serialize, [](gser_context_t *, gser_reader_t *r, void **, void *) {
            return gser_reader_fail(r, GSER_ERR_FORMAT, "family %s, version %u: refused", gser_reader_get_family(r),
                                    gser_reader_get_version(r));
        });
    TaskMsg ok;
    build_task_msg(ctx.get(), ok, 1);
    auto frames = serialize(ctx.get(), ok.msg.get());
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_deserialize(rx.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), nullptr,
                               &m),
              GSER_ERR_FORMAT);
    EXPECT_EQ(m, nullptr);
    EXPECT_EQ(error_of(rx.get()), "gser_deserialize: $.tasks[3].payload: type \"test.blob\", family \"host\": "
                                  "deserializer failed: family host, version 1: refused");
}

TEST(PassThrough, UnknownTypesAreKeptAndForwardedByteIdentical)
{
    auto sender = make_ctx();
    BlobStats stats;
    register_blob(sender.get(), &stats, {"host"});
    TaskMsg t;
    build_task_msg(sender.get(), t);
    auto frames = serialize(sender.get(), t.msg.get());
    ASSERT_EQ(gser_frames_get_count(frames.get()), 3u);

    // The scheduler knows nothing about test.blob.
    auto sched = make_ctx();
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_deserialize(sched.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), nullptr,
                               &m),
              GSER_ERR_UNKNOWN_TYPE);
    EXPECT_EQ(error_of(sched.get()), "gser_deserialize: $.tasks[3].payload: type \"test.blob\" is not registered");
    auto kept = deserialize(sched.get(), frames.get(), GSER_DESERIALIZE_ALLOW_UNKNOWN);
    ASSERT_TRUE(kept);
    gser_value_t *p = payload_of(kept.get());
    EXPECT_EQ(gser_value_get_kind(p), GSER_KIND_SERIALIZED);

    // Forwarding the whole message: same header bytes, same frame memory.
    auto fwd = serialize(sched.get(), kept.get());
    ASSERT_TRUE(fwd);
    EXPECT_EQ(header_bytes(fwd.get()), header_bytes(frames.get()));
    ASSERT_EQ(gser_frames_get_count(fwd.get()), gser_frames_get_count(frames.get()));
    for (size_t i = 1; i < gser_frames_get_count(fwd.get()); i++)
        EXPECT_EQ(gser_frames_get_array(fwd.get())[i].data, gser_frames_get_array(frames.get())[i].data) << i;
    EXPECT_EQ(stats.serialized, 1) << "forwarding ran no type code";

    // Forwarding the payload inside a new message keeps its sub-header intact.
    gser_msg_t *out = nullptr;
    ASSERT_EQ(gser_msg_create(sched.get(), &out), GSER_OK);
    MsgPtr outp(out);
    gser_value_t *root, *v;
    gser_msg_new_map(out, &root);
    gser_msg_new_cstr(out, "forwarded", &v);
    gser_map_put_cstr(root, "op", v);
    gser_map_put_cstr(root, "payload", p);
    gser_msg_set_root(out, root);
    auto fwd2 = serialize(sched.get(), out);
    ASSERT_EQ(gser_frames_get_count(fwd2.get()), 2u) << "just the payload's frame";

    // The worker at the other end rebuilds the object.
    auto worker = make_ctx();
    BlobStats wstats;
    register_blob(worker.get(), &wstats, {"host"});
    auto final_msg = deserialize(worker.get(), fwd2.get());
    ASSERT_TRUE(final_msg);
    gser_value_t *obj_v;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(final_msg.get()), "payload", &obj_v), GSER_OK);
    void *obj;
    ASSERT_EQ(gser_value_get_object(obj_v, nullptr, &obj), GSER_OK);
    EXPECT_EQ(static_cast<Blob *>(obj)->data, t.blob.data);
    gser_serialized_info_t info = GSER_SERIALIZED_INFO_INIT;
    ASSERT_EQ(gser_value_get_serialized(p, &info), GSER_OK);
    auto kept2 = deserialize(sched.get(), fwd2.get(), GSER_DESERIALIZE_KEEP_SERIALIZED);
    gser_value_t *p2;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(kept2.get()), "payload", &p2), GSER_OK);
    gser_serialized_info_t info2 = GSER_SERIALIZED_INFO_INIT;
    ASSERT_EQ(gser_value_get_serialized(p2, &info2), GSER_OK);
    ASSERT_EQ(info.header_len, info2.header_len);
    EXPECT_EQ(std::memcmp(info.header, info2.header, info.header_len), 0) << "sub-header byte-identical";
    EXPECT_TRUE(gser_value_equal(p, p2));

    // And its sub-tree can be looked at without the type.
    gser_value_t *tree;
    ASSERT_EQ(gser_value_decode_serialized(kept.get(), p, &tree), GSER_OK) << error_of(sched.get());
    gser_value_t *name;
    ASSERT_EQ(gser_map_find_cstr(tree, "name", &name), GSER_OK);
    const char *s;
    gser_value_get_str(name, &s, nullptr);
    EXPECT_EQ(std::string(s), t.blob.name);
}

TEST(PassThrough, KeepSerializedRunsNoTypeCodeEvenWhenRegistered)
{
    auto ctx = make_ctx();
    BlobStats stats;
    register_blob(ctx.get(), &stats, {"host"});
    TaskMsg t;
    build_task_msg(ctx.get(), t);
    auto frames = serialize(ctx.get(), t.msg.get());
    auto kept = deserialize(ctx.get(), frames.get(), GSER_DESERIALIZE_KEEP_SERIALIZED);
    ASSERT_TRUE(kept);
    EXPECT_EQ(gser_value_get_kind(payload_of(kept.get())), GSER_KIND_SERIALIZED);
    EXPECT_EQ(stats.deserialized, 0);
    auto fwd = serialize(ctx.get(), kept.get());
    EXPECT_EQ(header_bytes(fwd.get()), header_bytes(frames.get()));
    EXPECT_EQ(stats.serialized, 1);
}

// A "pair" type whose sub-tree holds two nested blobs: objects inside objects.
struct Pair {
    Blob a, b;
};

static gser_status_t pair_ser(gser_context_t *, const void *obj, gser_writer_t *w, void *)
{
    auto *p = static_cast<const Pair *>(obj);
    gser_msg_t *m = gser_writer_get_msg(w);
    gser_value_t *l, *x;
    gser_msg_new_list(m, &l);
    gser_msg_new_object(m, "test.blob", (void *)&p->a, &x);
    gser_list_append(l, x);
    gser_msg_new_object(m, "test.blob", (void *)&p->b, &x);
    gser_list_append(l, x);
    return gser_writer_set_root(w, l);
}

static gser_status_t pair_de(gser_context_t *, gser_reader_t *r, void **out, void *)
{
    gser_value_t *t = gser_reader_get_tree(r);
    gser_value_t *a, *b;
    void *pa, *pb;
    if (gser_list_get(t, 0, &a) || gser_list_get(t, 1, &b) || gser_value_get_object(a, nullptr, &pa) ||
        gser_value_get_object(b, nullptr, &pb))
        return GSER_ERR_FORMAT;
    auto *p = new Pair{*static_cast<Blob *>(pa), *static_cast<Blob *>(pb)};
    *out = p;
    return GSER_OK;
}

TEST(PassThrough, NestedObjectsWithFramesRoundTripAndForward)
{
    auto ctx = make_ctx();
    BlobStats stats;
    register_blob(ctx.get(), &stats, {"host"});
    gser_type_options_t to = GSER_TYPE_OPTIONS_INIT;
    to.destroy = [](void *o, void *) { delete static_cast<Pair *>(o); };
    ASSERT_EQ(gser_type_register(ctx.get(), "test.pair", 1, &to), GSER_OK);
    ASSERT_EQ(gser_type_add_family(ctx.get(), "test.pair", "host", pair_ser, pair_de), GSER_OK);
    Pair pair;
    pair.a = Blob{1, "a", std::vector<double>(100, 1.0)};
    pair.b = Blob{2, "b", std::vector<double>(200, 2.0)};
    std::vector<double> top(64, 9.0);
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *root, *v;
    gser_msg_new_list(m, &root);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = top.data();
    d.nbytes = top.size() * 8;
    d.dtype = GSER_DTYPE_FLOAT64;
    gser_msg_new_buffer(m, &d, &v);
    gser_list_append(root, v); // frame 1
    gser_msg_new_object(m, "test.pair", &pair, &v);
    gser_list_append(root, v); // frames 2, 3
    gser_msg_new_buffer(m, &d, &v);
    gser_list_append(root, v); // frame 4
    gser_msg_set_root(m, root);
    auto frames = serialize(ctx.get(), m);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 5u);
    EXPECT_EQ(gser_frames_get_array(frames.get())[2].size, 800u);
    EXPECT_EQ(gser_frames_get_array(frames.get())[3].size, 1600u);

    auto back = deserialize(ctx.get(), frames.get());
    gser_value_t *pv;
    ASSERT_EQ(gser_list_get(gser_msg_get_root(back.get()), 1, &pv), GSER_OK);
    void *obj;
    ASSERT_EQ(gser_value_get_object(pv, nullptr, &obj), GSER_OK);
    EXPECT_EQ(static_cast<Pair *>(obj)->b.data, pair.b.data);
    EXPECT_EQ(static_cast<Pair *>(obj)->a.name, "a");

    auto sched = make_ctx();
    auto kept = deserialize(sched.get(), frames.get(), GSER_DESERIALIZE_ALLOW_UNKNOWN);
    auto fwd = serialize(sched.get(), kept.get());
    EXPECT_EQ(header_bytes(fwd.get()), header_bytes(frames.get()));
    gser_value_t *kv, *tree;
    ASSERT_EQ(gser_list_get(gser_msg_get_root(kept.get()), 1, &kv), GSER_OK);
    ASSERT_EQ(gser_value_decode_serialized(kept.get(), kv, &tree), GSER_OK) << error_of(sched.get());
    ASSERT_EQ(gser_value_get_len(tree), 2u);
    gser_value_t *inner;
    gser_list_get(tree, 1, &inner);
    EXPECT_EQ(gser_value_get_kind(inner), GSER_KIND_SERIALIZED) << "nested objects stay serialized";
}

// "test.bag": a vector of ints, written as a list of one-item lists, so that
// its sub-header holds thousands of msgpack arrays.
using Bag = std::vector<int64_t>;

static gser_status_t bag_serialize(gser_context_t *, const void *obj, gser_writer_t *w, void *)
{
    gser_msg_t *m = gser_writer_get_msg(w);
    gser_value_t *list, *item;
    gser_status_t st = gser_msg_new_list(m, &list);
    for (int64_t x : *static_cast<const Bag *>(obj))
        if (st || (st = gser_msg_new_list(m, &item)) || (st = gser_list_append_int(item, x)) ||
            (st = gser_list_append(list, item)))
            return st;
    return st ? st : gser_writer_set_root(w, list);
}

static gser_status_t bag_deserialize(gser_context_t *, gser_reader_t *r, void **out, void *)
{
    gser_value_t *t = gser_reader_get_tree(r);
    auto b = std::make_unique<Bag>();
    for (size_t i = 0; i < gser_value_get_len(t); i++) {
        gser_value_t *item, *x;
        int64_t v;
        if (gser_list_get(t, i, &item) || gser_list_get(item, 0, &x) || gser_value_get_int(x, &v))
            return gser_reader_fail(r, GSER_ERR_FORMAT, "bag item %zu is not [int]", i);
        b->push_back(v);
    }
    *out = b.release();
    return GSER_OK;
}

// A header of thousands of items, and objects whose sub-headers are parsed
// while the header's own items are still in use: the parser's scratch grows
// past its first buffer into heap blocks, each large sub-header takes a block
// of its own and gives it back, and small ones reuse the space (ASan watches).
TEST(Objects, LargeHeadersAndLargeSubHeadersDecode)
{
    auto ctx = make_ctx();
    gser_type_options_t to = GSER_TYPE_OPTIONS_INIT;
    to.destroy = [](void *o, void *) { delete static_cast<Bag *>(o); };
    ASSERT_EQ(gser_type_register(ctx.get(), "test.bag", 1, &to), GSER_OK);
    ASSERT_EQ(gser_type_add_family(ctx.get(), "test.bag", "host", bag_serialize, bag_deserialize), GSER_OK);
    const int n = 40, keys = 16, items = 3000;
    std::vector<Bag> bags(n);
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *root, *v, *map;
    ASSERT_EQ(gser_msg_new_list(m, &root), GSER_OK);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < (i % 2 ? 5 : items); j++) /* small ones reuse what big ones gave back */
            bags[i].push_back((int64_t)i * 1000000 + j);
        ASSERT_EQ(gser_msg_new_object(m, "test.bag", &bags[i], &v), GSER_OK);
        ASSERT_EQ(gser_list_append(root, v), GSER_OK);
        ASSERT_EQ(gser_msg_new_map(m, &map), GSER_OK);
        for (int k = 0; k < keys; k++) {
            ASSERT_EQ(gser_msg_new_int(m, (int64_t)i * 100 + k, &v), GSER_OK);
            ASSERT_EQ(gser_map_put_cstr(map, ("k" + std::to_string(k)).c_str(), v), GSER_OK);
        }
        ASSERT_EQ(gser_list_append(root, map), GSER_OK);
    }
    gser_msg_set_root(m, root);
    auto frames = serialize(ctx.get(), m);
    ASSERT_TRUE(frames);
    auto back = deserialize(ctx.get(), frames.get());
    ASSERT_TRUE(back) << error_of(ctx.get());
    gser_value_t *r = gser_msg_get_root(back.get());
    ASSERT_EQ(gser_value_get_len(r), (size_t)(2 * n));
    for (int i = 0; i < n; i++) {
        gser_value_t *ov, *mv, *kv;
        ASSERT_EQ(gser_list_get(r, (size_t)(2 * i), &ov), GSER_OK);
        void *obj = nullptr;
        ASSERT_EQ(gser_value_get_object(ov, nullptr, &obj), GSER_OK);
        EXPECT_EQ(*static_cast<const Bag *>(obj), bags[i]) << i;
        ASSERT_EQ(gser_list_get(r, (size_t)(2 * i + 1), &mv), GSER_OK);
        ASSERT_EQ(gser_value_get_len(mv), (size_t)keys);
        int64_t x = -1;
        ASSERT_EQ(gser_map_find_cstr(mv, "k15", &kv), GSER_OK);
        ASSERT_EQ(gser_value_get_int(kv, &x), GSER_OK);
        EXPECT_EQ(x, (int64_t)i * 100 + 15);
    }
}

TEST(Versions, MismatchNamesBothVersionsUnlessOlderOnesAreReadable)
{
    auto sender = make_ctx();
    BlobStats s;
    register_blob(sender.get(), &s, {"host"}, 2);
    TaskMsg t;
    build_task_msg(sender.get(), t);
    auto frames = serialize(sender.get(), t.msg.get());

    struct Rx {
        uint32_t version, min_read;
        gser_status_t expect;
        const char *text;
    } cases[] = {
        {1, 0, GSER_ERR_VERSION, "type \"test.blob\" is version 2 in the message, version 1 here"},
        {3, 0, GSER_ERR_VERSION, "type \"test.blob\" is version 2 in the message, version 3 here"},
        {3, 3, GSER_ERR_VERSION, "version 2 in the message, version 3 here"},
        {4, 3, GSER_ERR_VERSION, "version 2 in the message, versions 3..4 can be read here"},
        {3, 2, GSER_OK, ""},
        {2, 0, GSER_OK, ""},
    };
    for (const Rx &c : cases) {
        auto rx = make_ctx();
        BlobStats rs;
        register_blob(rx.get(), &rs, {"host"}, c.version, c.min_read);
        gser_msg_t *m = nullptr;
        gser_status_t st =
            gser_deserialize(rx.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), nullptr, &m);
        EXPECT_EQ(st, c.expect) << c.version << "/" << c.min_read;
        if (st == GSER_OK) {
            void *obj;
            ASSERT_EQ(gser_value_get_object(payload_of(m), nullptr, &obj), GSER_OK);
            EXPECT_EQ(static_cast<Blob *>(obj)->id, t.blob.id);
        } else {
            EXPECT_NE(error_of(rx.get()).find(c.text), std::string::npos) << error_of(rx.get());
            EXPECT_NE(error_of(rx.get()).find("$.tasks[3].payload"), std::string::npos);
        }
        gser_msg_destroy(m);
    }
}

TEST(Objects, TakeObjectTransfersOwnership)
{
    auto ctx = make_ctx();
    BlobStats stats;
    register_blob(ctx.get(), &stats, {"host"});
    TaskMsg t;
    build_task_msg(ctx.get(), t);
    auto frames = serialize(ctx.get(), t.msg.get());
    void *obj = nullptr;
    {
        auto back = deserialize(ctx.get(), frames.get());
        ASSERT_EQ(gser_value_take_object(payload_of(back.get()), &obj), GSER_OK);
    }
    EXPECT_EQ(stats.destroyed, 0) << "taken: the message did not destroy it";
    blob_destroy(obj, &stats);
    EXPECT_EQ(stats.destroyed, 1);
}

TEST(Threads, OneContextManyThreads)
{
    auto ctx = make_ctx();
    register_blob(ctx.get(), nullptr, {"host"}); // no shared counters across threads
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int th = 0; th < 4; th++) {
        threads.emplace_back([&, th] {
            for (int i = 0; i < 300; i++) {
                TaskMsg t;
                build_task_msg(ctx.get(), t, th * 1000 + i);
                gser_frames_t *f = nullptr;
                if (gser_serialize(ctx.get(), t.msg.get(), nullptr, &f) != GSER_OK) {
                    failures++;
                    continue;
                }
                gser_msg_t *m = nullptr;
                if (gser_deserialize(ctx.get(), gser_frames_get_array(f), gser_frames_get_count(f), nullptr, &m) != GSER_OK) {
                    failures++;
                } else {
                    void *obj = nullptr;
                    gser_value_get_object(payload_of(m), nullptr, &obj);
                    if (!obj || static_cast<Blob *>(obj)->id != th * 1000 + i ||
                        static_cast<Blob *>(obj)->data != t.blob.data)
                        failures++;
                }
                gser_msg_destroy(m);
                gser_frames_destroy(f);
                // Each thread sees its own error message.
                gser_frame_t junk = {"junk", 4, GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
                m = nullptr;
                if (gser_deserialize(ctx.get(), &junk, 1, nullptr, &m) != GSER_ERR_BAD_MAGIC)
                    failures++;
                std::string err = gser_context_get_last_error(ctx.get());
                if (err.find("not a gser header") == std::string::npos)
                    failures++;
            }
        });
    }
    for (auto &t : threads)
        t.join();
    EXPECT_EQ(failures.load(), 0);
}

// What serializers and deserializers can see of the call they run in.
static void *g_seen_stream;
static unsigned g_seen_flags;

static gser_status_t peek_ser(gser_context_t *c, const void *obj, gser_writer_t *w, void *ud)
{
    g_seen_stream = gser_writer_get_stream(w);
    return blob_serialize(c, obj, w, ud);
}

static gser_status_t peek_de(gser_context_t *c, gser_reader_t *r, void **out, void *ud)
{
    g_seen_flags = gser_reader_get_flags(r);
    g_seen_stream = gser_reader_get_stream(r);
    return blob_deserialize(c, r, out, ud);
}

TEST(Callbacks, SeeTheStreamAndFlagsOfTheCall)
{
    auto ctx = make_ctx();
    gser_type_options_t to = GSER_TYPE_OPTIONS_INIT;
    to.destroy = blob_destroy;
    ASSERT_EQ(gser_type_register(ctx.get(), "test.blob", 1, &to), GSER_OK);
    ASSERT_EQ(gser_type_add_family(ctx.get(), "test.blob", "host", peek_ser, peek_de), GSER_OK);
    TaskMsg t;
    build_task_msg(ctx.get(), t);
    int marker;
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.stream = &marker; // never used: the message has no device buffers
    auto frames = serialize(ctx.get(), t.msg.get(), &so);
    EXPECT_EQ(g_seen_stream, &marker);
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = GSER_DESERIALIZE_ALLOW_UNKNOWN;
    o.stream = &t;
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_deserialize(ctx.get(), gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), &o, &m),
              GSER_OK);
    EXPECT_EQ(g_seen_flags, (unsigned)GSER_DESERIALIZE_ALLOW_UNKNOWN);
    EXPECT_EQ(g_seen_stream, &t);
    gser_msg_destroy(m);
}

TEST(Callbacks, PluginsCanReportThroughTheContext)
{
    auto ctx = make_ctx();
    EXPECT_EQ(gser_context_fail(ctx.get(), GSER_ERR_CONNECTION, "peer %s went away", "10.0.0.7"),
              GSER_ERR_CONNECTION);
    EXPECT_STREQ(gser_context_get_last_error(ctx.get()), "peer 10.0.0.7 went away");
}
