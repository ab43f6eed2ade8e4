"""Stores: models, sessions by name, checkpoints, prefixes, gc, compact,
export and import, metadata, read-only stores, names."""
import errno

import numpy as np
import pytest

import ctxstore
from conftest import append, token_kv


@pytest.fixture
def store(tmp_path, model):
    with ctxstore.Store(tmp_path / "store", create=True) as st:
        st.register_model(model, "tiny")
        yield st


def test_store_sessions_take_attention_windows(store, model):
    aw = ctxstore.AttentionWindows(2, 3, 0b10)
    with store.create_session("a", model, capacity=16, attention_windows=aw) as s:
        append(s, range(8))
        assert s.attn_plan(layer=0).slots().tolist() == [5, 6, 7]
    with store.open_session("a", model, attention_windows=aw) as s:
        assert s.attn_plan(layer=0).slots().tolist() == [5, 6, 7]
    with store.open_session("a", model) as s:
        assert s.attn_plan(layer=0).slots().tolist() == list(range(8))
    with store.fork("a", "b", 4, open=True, attention_windows=aw) as s:
        assert s.attn_plan(layer=0).slots().tolist() == [1, 2, 3]


def test_open_missing_and_foreign(tmp_path):
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Store(tmp_path / "nope")
    assert e.value.code == -errno.ENOENT
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x").write_text("x")
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Store(tmp_path / "plain")
    assert e.value.code == ctxstore.EFOREIGN
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Store(tmp_path / "both", create=True, readonly=True)
    assert e.value.code == ctxstore.EINVAL


def test_models_and_hash_file(store, model, tmp_path):
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"weights" * 1000)
    h = store.hash_file(weights)
    assert isinstance(h, bytes) and len(h) == 16
    assert store.hash_file(str(weights)) == h
    assert store.tokenizer_hash_file(weights) != h
    m2 = ctxstore.Model(1, 1, 8, dtype="bf16", model_hash=h)
    store.register_model(m2)
    models = {e.model.model_hash: e for e in store.models()}
    assert models[model.model_hash].name == "tiny" and models[model.model_hash].model == model
    assert models[h].model.dtype == ctxstore.DTYPE_BF16
    with pytest.raises(ctxstore.Error) as e:
        store.register_model(m2._replace(head_dim=16))
    assert e.value.code == ctxstore.EMODEL
    with pytest.raises(ctxstore.Error) as e:
        store.hash_file(tmp_path / "missing")
    assert e.value.code == -errno.ENOENT


def test_sessions_by_name(store, model):
    with store.create_session("chat", model, capacity=32) as s:
        append(s, range(5))
    assert "chat" in store and "other" not in store
    [e] = store.sessions()
    assert e.name == "chat" and e.n_tokens == 5 and not e.pinned and e.id > 0
    assert e.model_hash == model.model_hash
    with store.open_session("chat", model) as s:
        assert s.tokens().tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(ctxstore.Error) as e:
            store.open_session("chat", model)
        assert e.value.code == ctxstore.EBUSY
        with store.open_session("chat", readonly=True) as r:
            assert r.readonly and r.n_tokens == 5
        with pytest.raises(ctxstore.Error) as e:
            store.delete("chat")
        assert e.value.code == ctxstore.EBUSY
    with pytest.raises(ctxstore.Error) as e:
        store.create_session("chat", model)
    assert e.value.code == ctxstore.ETAKEN
    with pytest.raises(ctxstore.Error) as e:
        store.create_session("x", model._replace(model_hash=b"z" * 16))
    assert e.value.code == ctxstore.ENOMODEL
    store.rename("chat", "chat 2")
    assert [e.name for e in store.sessions()] == ["chat 2"]
    with pytest.raises(ctxstore.Error) as e:
        store.open_session("chat", model)
    assert e.value.code == ctxstore.ENOTFOUND and "'chat'" in str(e.value)
    store.delete("chat 2")
    assert store.sessions() == []


def test_bad_names_say_why(store, model):
    for bad, why in (("a/b", "'/'"), ("", "empty"), ("..", "'..'"), ("x" * 300, "longer")):
        with pytest.raises(ctxstore.Error) as e:
            store.create_session(bad, model)
        assert e.value.code == ctxstore.EINVAL and why in str(e.value), str(e.value)
    store.create_session("ok", model, capacity=16).close()
    with pytest.raises(ctxstore.Error) as e:
        store.rename("ok", "bad/name")
    assert "'bad/name' contains '/'" in str(e.value)
    with pytest.raises(ctxstore.Error) as e:
        store.set_meta("ok", "bad\nkey", b"v")
    assert "control" in str(e.value)
    with pytest.raises(ctxstore.Error) as e:
        store.fork("ok", "new", checkpoint="a/b")
    assert "'a/b'" in str(e.value)
    with pytest.raises(ValueError):
        store.delete("nul\0byte")


def test_checkpoints_and_forks(store, model):
    with store.create_session("base", model, capacity=32) as s:
        append(s, range(4))
        s.checkpoint("four")
        append(s, range(4, 8))
        s.checkpoint("eight")
        cps = s.checkpoints()
        assert [(c.name, c.n_tokens, c.stale) for c in cps] == [("eight", 8, False),
                                                                ("four", 4, False)]
        with pytest.raises(ctxstore.Error) as e:
            s.checkpoint("four")
        assert e.value.code == ctxstore.ETAKEN
        s.restore("four")
        assert s.n_tokens == 4
        append(s, [40, 41])
        assert {c.name: c.stale for c in s.checkpoints()} == {"eight": True, "four": False}
        with pytest.raises(ctxstore.Error) as e:
            s.restore("eight")
        assert e.value.code == ctxstore.ESTALE
        s.delete_checkpoint("eight")
        with pytest.raises(ctxstore.Error) as e:
            s.delete_checkpoint("eight")
        assert e.value.code == ctxstore.ENOTFOUND
    assert store.fork("base", "f3", 3) is None
    store.fork("base", "fcp", checkpoint="four")
    with store.fork("base", "fall", open=True) as f:
        assert f.tokens().tolist() == [0, 1, 2, 3, 40, 41]
        np.testing.assert_array_equal(f.read_token(5)[0], token_kv(5)[0])
    entries = {e.name: e for e in store.sessions()}
    assert entries["f3"].n_tokens == 3 and entries["f3"].fork_tokens == 3
    assert entries["fcp"].n_tokens == 4 and entries["fcp"].parent_id == entries["base"].id
    with pytest.raises(ValueError):
        store.fork("base", "x", 2, checkpoint="four")
    with pytest.raises(ctxstore.Error) as e:
        store.fork("nope", "x")
    assert e.value.code == ctxstore.ENOTFOUND


def test_checkpoint_needs_a_store(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "p.ctxs", model, capacity=16) as s:
        with pytest.raises(ctxstore.Error) as e:
            s.checkpoint("x")
        assert e.value.code == ctxstore.EINVAL


def test_prefix_find(store, model):
    prompt = np.arange(1000, 1000 + 150, dtype=np.uint32)
    with store.create_session("long", model, capacity=256) as s:
        append(s, prompt)
    assert store.prefix_find(model.model_hash, prompt[:10]) is None  # < one chunk
    name, n = store.prefix_find(model.model_hash, list(prompt[:100]) + [7, 7])
    assert (name, n) == ("long", 100)
    assert store.prefix_find(model.model_hash, prompt) == ("long", 150)
    assert store.prefix_find(b"q" * 16, prompt) is None
    with pytest.raises(ValueError):
        store.prefix_find(b"short", prompt)


def test_pin_and_gc(store, model):
    for name in ("a", "b", "c"):
        with store.create_session(name, model, capacity=64) as s:
            append(s, range(40))
    store.pin("a")
    assert store.session("a").pinned
    dry = store.gc(0, dry_run=True)
    assert dry.deleted == ["b", "c"] and dry.bytes_before > 0
    assert len(store.sessions()) == 3
    with store.open_session("c", model):
        res = store.gc(0)
        assert res.deleted == ["b"] and res.skipped_open == 1
    assert [e.name for e in store.sessions()] == ["a", "c"]
    store.pin("a", pinned=False)
    assert not store.session("a").pinned
    assert sorted(store.gc(0).deleted) == ["a", "c"]
    assert store.sessions() == []


def test_compact(store, model):
    with store.create_session("c", model, capacity=64) as s:
        append(s, range(40))
        s.rollback(2)
    one = store.compact("c")
    assert one.sessions == 1 and one.bytes_after <= one.bytes_before
    every = store.compact()
    assert every.sessions == 1 and isinstance(every.index_compacted, bool)
    with store.open_session("c", model):
        with pytest.raises(ctxstore.Error) as e:
            store.compact("c")
        assert e.value.code == ctxstore.EBUSY
    assert store.repair()["files_adopted"] == 0
    assert store.reindex()["sessions"] == 1


def test_export_import(store, model, tmp_path):
    with store.create_session("src", model, capacity=32) as s:
        append(s, range(9))
    store.set_meta("src", "title", "Trip to Lisbon")
    out = tmp_path / "src.ctxe"
    store.export("src", out)
    with pytest.raises(ctxstore.Error) as e:
        store.export("src", out)
    assert e.value.code == -errno.EEXIST
    with ctxstore.Store(tmp_path / "other", create=True) as st2:
        assert st2.import_(out) == "src"
        assert st2.import_(out, name="copy") == "copy"
        assert st2.get_meta("copy", "title") == b"Trip to Lisbon"
        assert len(st2.models()) == 1
        with st2.open_session("copy", model) as s:
            assert s.tokens().tolist() == list(range(9))
            np.testing.assert_array_equal(s.read_token(8)[1], token_kv(8)[1])
    bad = tmp_path / "bad.ctxe"
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(ctxstore.Error) as e:
        store.import_(bad, name="bad")
    assert e.value.code == ctxstore.ECORRUPT
    with pytest.raises(ctxstore.Error) as e:
        store.import_(tmp_path / "src.ctxe", name="src")
    assert e.value.code == ctxstore.ETAKEN


def test_metadata(store, model):
    store.create_session("m", model, capacity=16).close()
    store.set_meta("m", "title", "héllo")
    store.set_meta("m", "blob", b"\x00\x01")
    store.set_meta("m", "empty", b"")
    assert store.get_meta("m", "title") == "héllo".encode()
    assert store.list_meta("m") == {"blob": b"\x00\x01", "empty": b"", "title": "héllo".encode()}
    store.delete_meta("m", "blob")
    with pytest.raises(ctxstore.Error) as e:
        store.get_meta("m", "blob")
    assert e.value.code == ctxstore.ENOTFOUND
    with pytest.raises(ctxstore.Error) as e:
        store.set_meta("m", "big", b"x" * (ctxstore.META_VALUE_MAX + 1))
    assert e.value.code == ctxstore.ETOOBIG
    with pytest.raises(ctxstore.Error) as e:
        store.set_meta("nope", "k", b"v")
    assert e.value.code == ctxstore.ENOTFOUND


def test_readonly_store(tmp_path, model):
    with ctxstore.Store(tmp_path / "s", create=True) as st:
        st.register_model(model)
        with st.create_session("x", model, capacity=16) as s:
            append(s, [1, 2])
    with ctxstore.Store(tmp_path / "s", readonly=True) as ro:
        assert [e.name for e in ro.sessions()] == ["x"]
        with ro.open_session("x", readonly=True) as s:
            assert s.n_tokens == 2
        for call in (lambda: ro.open_session("x", model), lambda: ro.delete("x"),
                     lambda: ro.create_session("y", model), lambda: ro.pin("x"),
                     lambda: ro.gc(0), lambda: ro.rename("x", "y")):
            with pytest.raises(ctxstore.Error) as e:
                call()
            assert e.value.code == ctxstore.EREADONLY, call
        assert ro.gc(0, dry_run=True).deleted == ["x"]


def test_closed_store_refuses(tmp_path):
    st = ctxstore.Store(tmp_path / "s", create=True)
    st.close()
    st.close()
    for call in (st.sessions, st.models, lambda: st.delete("x"), lambda: st.gc(0)):
        with pytest.raises(ctxstore.Error) as e:
            call()
        assert "store is closed" in str(e.value)
