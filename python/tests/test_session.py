"""Sessions on their own: the write path, reads, window, plans, errors."""
import errno
import os
import threading

import numpy as np
import pytest

import ctxstore
from conftest import D, H, L, append, token_kv


def test_constants_and_errors_module():
    assert ctxstore.DTYPE_F16 == 1 and ctxstore.DTYPE_BF16 == 2
    assert ctxstore.DTYPE_Q8 == 3 and ctxstore.DTYPE_F32 == 4
    assert ctxstore.EBUSY == -32005 and ctxstore.ECORRUPT == -32001
    assert ctxstore.err_name(ctxstore.EBUSY) == "CTXS_EBUSY"
    assert ctxstore.err_name(-errno.ENOENT) == "ENOENT"
    assert "another writer" in ctxstore.strerror(ctxstore.EBUSY)
    assert ctxstore.name_check("ok") is None
    assert "'/'" in ctxstore.name_check("a/b")
    assert "Session" in ctxstore.__doc__ and ctxstore.Session.k.__doc__
    assert ctxstore.attention_isa() in ("avx512", "avx2", "neon", "portable")


def test_create_write_commit_reopen(tmp_path, model):
    path = tmp_path / "a.ctxs"
    with ctxstore.Session.create(path, model, capacity=64) as s:
        assert s.n_tokens == 0 and s.capacity == 64 and s.n_sink == 4
        assert s.shape == (H, 64, D) and s.dtype == ctxstore.DTYPE_F16
        r = append(s, [10, 11, 12])
        assert r.first_pos == 0 and r.n_tokens == 3 and r.slot(2) == 2
        append(s, np.array([13, 14], dtype=np.uint32))
        assert s.n_tokens == 5
    with ctxstore.Session.open(path, model) as s:
        assert s.n_tokens == 5
        assert s.tokens().tolist() == [10, 11, 12, 13, 14]
        assert s.tokens(1, 2).dtype == np.uint32
        assert s.tokens(from_pos=3).tolist() == [13, 14]
        for pos in range(5):
            k, v = s.read_token(pos)
            ek, ev = token_kv(pos)
            assert k.dtype == np.float32 and k.shape == (L, H, D)
            np.testing.assert_array_equal(k, ek)
            np.testing.assert_array_equal(v, ev)
            # The view is the same bytes, in place, [heads, capacity, dim].
            slot = s.slot(pos)
            np.testing.assert_array_equal(s.k(1)[:, slot].astype(np.float32), ek[1])
            np.testing.assert_array_equal(s.v(0)[:, slot].astype(np.float32), ev[0])
        info = s.info()
        assert info.n_tokens == 5 and info.capacity == 64 and info.model == model
        assert info.durability == "async" and not info.ring and not info.readonly
        s.verify()
        s.sync()
        s.refresh()
        s.prefetch()


def test_write_through_views_then_commit(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "v.ctxs", model, capacity=32) as s:
        r = s.reserve(2)
        for i in range(2):
            k, v = token_kv(i)
            slot = r.slot(i)
            for layer in range(L):
                s.k(layer)[:, slot] = k[layer]
                s.v(layer)[:, slot] = v[layer]
        s.commit([1, 2])
        s.verify()
        np.testing.assert_array_equal(s.read_token(1)[0], token_kv(1)[0])


def test_commit_token_id_forms(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "t.ctxs", model, capacity=32) as s:
        append(s, (7, 8))
        append(s, np.array([2**32 - 1], dtype=np.int64))
        assert s.tokens().tolist() == [7, 8, 2**32 - 1]
        for bad, exc in (([-1], ValueError), ([2**32], ValueError),
                         ([1.5], TypeError), ([[1]], ValueError), ("ab", ValueError), ([b"x"], TypeError)):
            s.reserve(1)
            with pytest.raises(exc):
                s.commit(bad)
        with pytest.raises(ctxstore.Error) as e:
            s.commit([])  # n == 0
        assert e.value.code == ctxstore.EINVAL
        with pytest.raises(ctxstore.Error) as e:
            s.commit(list(range(7)))  # more than the 6 reserved above
        assert e.value.code == ctxstore.EINVAL and "commit of 7 tokens" in str(e.value)
        assert s.n_tokens == 3


def test_write_token_checks_dtype_and_shape(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "w.ctxs", model, capacity=32) as s:
        r = s.reserve(1)
        k, v = token_kv(0)
        with pytest.raises(TypeError, match="float32 or float16"):
            s.write_token(r, 0, k.astype(np.float64), v)
        with pytest.raises(TypeError, match="float32 or float16"):
            s.write_token(r, 0, k.astype(np.int32), v)
        with pytest.raises(TypeError, match="same dtype"):
            s.write_token(r, 0, k.astype(np.float16), v)
        with pytest.raises(ValueError, match="shape"):
            s.write_token(r, 0, k[:1], v[:1])
        with pytest.raises(ValueError, match="shape"):
            s.write_token(r, 0, k.reshape(-1), v.reshape(-1))
        with pytest.raises(TypeError):
            s.write_token((0, 1), 0, k, v)
        with pytest.raises(ctxstore.Error) as e:
            s.write_token(r, 1, k, v)  # i past the reservation
        assert e.value.code == ctxstore.EINVAL
        with pytest.raises(ValueError):
            s.write_token(r, -1, k, v)
        # float16 and non-contiguous float32 are fine.
        s.write_token(r, 0, k.astype(np.float16), v.astype(np.float16))
        s.write_token(r, 0, np.asfortranarray(k), np.asfortranarray(v))
        s.commit([5])
        np.testing.assert_array_equal(s.read_token(0)[0], k)


def test_write_layer_stores_what_write_token_stores(tmp_path, model):
    """A layer at a time, in two calls, in any order: the bytes write_token
    gives, in every session dtype, visible in the views before the commit."""
    for dtype in ("f16", "bf16", "q8"):
        m = ctxstore.Model(L, H, D, dtype=dtype, model_hash=b"m" * 16)
        with ctxstore.Session.create(tmp_path / f"t-{dtype}.ctxs", m, capacity=64) as a, \
                ctxstore.Session.create(tmp_path / f"l-{dtype}.ctxs", m, capacity=64) as b:
            append(a, range(10))
            r = b.reserve(10)
            kv = [token_kv(r.first_pos + i) for i in range(10)]
            for layer in reversed(range(L)):
                k = np.stack([kv[i][0][layer] for i in range(10)])  # [n, H, D]
                v = np.stack([kv[i][1][layer] for i in range(10)])
                b.write_layer(r, layer, 4, k[4:], v[4:].astype(np.float32))
                b.write_layer(r, layer, 0, k[:4].astype(np.float16), v[:4].astype(np.float16))
            # In the mapping already, where attention reads it.
            np.testing.assert_array_equal(np.asarray(b.k(1)[:, r.slot(3)]),
                                          np.asarray(a.k(1)[:, 3]))
            b.commit(list(range(10)))
            for pos in range(10):
                for x, y in zip(a.read_token(pos), b.read_token(pos)):
                    np.testing.assert_array_equal(x, y)
            assert b.verify() is None


def test_write_layer_checks_its_arguments(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "w.ctxs", model, capacity=32) as s:
        r = s.reserve(3)
        k = np.zeros((3, H, D), np.float32)
        with pytest.raises(TypeError, match="float32 or float16"):
            s.write_layer(r, 0, 0, k.astype(np.float64), k)
        with pytest.raises(TypeError, match="same dtype and shape"):
            s.write_layer(r, 0, 0, k, k[:2])
        with pytest.raises(ValueError, match="shape"):
            s.write_layer(r, 0, 0, k.reshape(3, -1), k.reshape(3, -1))
        with pytest.raises(ValueError, match="shape"):
            s.write_layer(r, 0, 0, k[:0], k[:0])
        with pytest.raises(ctxstore.Error) as e:
            s.write_layer(r, L, 0, k, k)  # no such layer
        assert e.value.code == ctxstore.EINVAL and "write_layer(layer=2" in str(e.value)
        with pytest.raises(ctxstore.Error) as e:
            s.write_layer(r, 0, 1, k, k)  # past the reservation
        assert e.value.code == ctxstore.EINVAL
        with pytest.raises(ValueError):
            s.write_layer(r, 0, -1, k, k)
        s.write_layer(r, 0, 0, np.asfortranarray(k), k)


def test_rollback_and_errors(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "r.ctxs", model, capacity=32) as s:
        append(s, range(6))
        s.rollback(4)
        assert s.n_tokens == 4
        with pytest.raises(ctxstore.Error) as e:
            s.rollback(5)
        assert e.value.code == ctxstore.EINVAL
        with pytest.raises(ctxstore.Error) as e:
            s.read_token(4)
        assert e.value.code == ctxstore.ENOTFOUND and e.value.name == "CTXS_ENOTFOUND"
        assert "read_token(4)" in str(e.value) and "not found" in str(e.value)
        with pytest.raises(ctxstore.Error):
            s.tokens(2, 5)
        with pytest.raises(ctxstore.Error):
            s.slot(9)


def test_window_attn_plan_and_ring(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "p.ctxs", model, capacity=16, n_sink=2,
                                 ring=True) as s:
        append(s, range(10))
        w = s.window()
        assert w.n_tokens == 10
        s.set_window(4)
        assert s.window().n_tokens == 6  # 2 sinks + 4
        assert s.info().partial_window
        plan = s.attn_plan()
        assert plan.n_tokens == 10 and plan.first_query == 9 and plan.window == 4
        assert plan.n_keys == sum(sp.count for sp in plan.spans) == 6
        assert plan.slots().tolist() == [0, 1, 6, 7, 8, 9]
        s.set_window(0)
        r = s.reserve(3)
        for i in range(3):
            s.write_token(r, i, *token_kv(r.first_pos + i))
        plan = s.attn_plan(n_pending=3)
        assert plan.n_tokens == 13 and plan.first_query == 10
        with pytest.raises(ctxstore.Error):
            s.attn_plan(n_pending=4)
        s.commit([1, 2, 3])
        # The ring wraps: positions past the capacity overwrite after the sinks.
        append(s, range(8))
        info = s.info()
        assert info.n_tokens == 21 and info.wrapped and info.n_held == 16
        assert s.slot(0) == 0 and s.slot(20) < 16
        with pytest.raises(ctxstore.Error) as e:
            s.read_token(3)
        assert e.value.code == ctxstore.EEVICTED
        np.testing.assert_array_equal(s.read_token(20)[1], token_kv(20)[1])


def test_attention_windows_of_the_open_plan_the_window_layers(tmp_path, model):
    # Layer 0 slides over its last 4 positions, layer 1 is global; the file
    # keeps both whole either way.
    aw = ctxstore.AttentionWindows(period=2, window=4, global_mask=0b10)
    with ctxstore.Session.create(tmp_path / "a.ctxs", model, capacity=32) as s:
        append(s, range(10))
        assert s.attn_plan(layer=0) == s.attn_plan()
    with ctxstore.Session.open(tmp_path / "a.ctxs", model, attention_windows=aw) as s:
        plan = s.attn_plan(layer=0)
        assert plan.n_sink == 0 and plan.n_keys == 4
        assert plan.slots().tolist() == [6, 7, 8, 9]
        assert s.attn_plan(layer=1) == s.attn_plan()
        assert s.attn_plan().slots().tolist() == list(range(10))
        with pytest.raises(ctxstore.Error) as e:
            s.attn_plan(layer=2)
        assert e.value.code == ctxstore.EINVAL
        np.testing.assert_array_equal(s.read_token(0)[0], token_kv(0)[0])
        with s.fork(tmp_path / "f.ctxs", 6, attention_windows=aw) as f:
            assert f.attn_plan(layer=0).slots().tolist() == [2, 3, 4, 5]
    with ctxstore.Session.create(tmp_path / "c.ctxs", model, capacity=32,
                                 attention_windows=aw) as s:
        append(s, range(6))
        assert s.attn_plan(layer=0).slots().tolist() == [2, 3, 4, 5]
    for bad, field in [((0, 4, 0), "attn_window"), ((2, 0, 0), "attn_window"),
                       ((2, 4, 0b11), "attn_global_mask"), ((2, 4, 0b100), "attn_global_mask"),
                       ((9, 4, 0), "attn_period")]:
        with pytest.raises(ctxstore.Error) as e:
            ctxstore.Session.open(tmp_path / "a.ctxs", model,
                                  attention_windows=ctxstore.AttentionWindows(*bad))
        assert e.value.code == ctxstore.EINVAL and field in str(e.value), (bad, str(e.value))
    with pytest.raises(ValueError, match="AttentionWindows"):
        ctxstore.Session.open(tmp_path / "a.ctxs", model, attention_windows=(2, 4))


def test_no_ring_fills_up(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "n.ctxs", model, capacity=8, ring=False) as s:
        append(s, range(8))
        with pytest.raises(ctxstore.Error) as e:
            s.reserve(1)
        assert e.value.code == ctxstore.EFULL


@pytest.mark.parametrize("durability", ["none", "async", "full", ctxstore.SYNC_FULL])
def test_durability_and_background(tmp_path, model, durability):
    with ctxstore.Session.create(tmp_path / "d.ctxs", model, capacity=16,
                                 durability=durability, background=False) as s:
        append(s, [1, 2])
        assert s.info().durability in ("none", "async", "full")
        assert not s.info().background
    with ctxstore.Session.open(tmp_path / "d.ctxs", model) as s:
        assert s.info().background
    with pytest.raises(ValueError):
        ctxstore.Session.create(tmp_path / "e.ctxs", model, durability="sometimes")


def test_write_token_takes_a_bf16_tensor_on_a_bf16_session(tmp_path, model):
    torch = pytest.importorskip("torch")
    m = ctxstore.Model(L, H, D, dtype="bf16")
    k = torch.randn(L, H, D).to(torch.bfloat16)
    v = torch.randn(L, H, D).to(torch.bfloat16)
    with ctxstore.Session.create(tmp_path / "b.ctxs", m, capacity=16) as s:
        r = s.reserve(1)
        s.write_token(r, 0, k, v)
        s.commit([7])
        # The very bits: bf16 goes in as it is.
        assert torch.equal(s.torch_k(1)[:, r.slot(0)], k[1])
        assert torch.equal(s.torch_v(0)[:, r.slot(0)], v[0])
        # A layer at a time too.
        r = s.reserve(2)
        kl = torch.randn(2, H, D).to(torch.bfloat16)
        for layer in range(L):
            s.write_layer(r, layer, 0, kl, kl)
        s.commit([8, 9])
        assert torch.equal(s.torch_k(L - 1)[:, r.slot(1)], kl[1])
    # Another dtype's session says what it takes, in its own terms.
    with ctxstore.Session.create(tmp_path / "f.ctxs", model, capacity=16) as s:
        r = s.reserve(1)
        with pytest.raises(TypeError, match="bfloat16 tensor, and this session holds f16"):
            s.write_token(r, 0, k, v)


def test_bf16_views(tmp_path):
    torch = pytest.importorskip("torch")
    m = ctxstore.Model(L, H, D, dtype="bf16")
    with ctxstore.Session.create(tmp_path / "b.ctxs", m, capacity=16) as s:
        append(s, [1, 2, 3])
        k = s.k(1)
        assert k.dtype == np.uint16 and k.shape == (H, 16, D)
        # bf16 is the high half of a float32.
        as_f32 = (k[:, :3].astype(np.uint32) << 16).view(np.float32)
        expect = np.stack([token_kv(p)[0][1] for p in range(3)], axis=1)
        np.testing.assert_array_equal(as_f32, expect)
        t = s.torch_k(1)
        assert t.dtype == torch.bfloat16 and tuple(t.shape) == (H, 16, D)
        np.testing.assert_array_equal(t[:, :3].float().numpy(), expect)
        tv = s.torch_v(0)
        tv[0, 5, 0] = 2.5  # same memory as the NumPy view
        assert s.v(0)[0, 5, 0] == np.array([2.5], np.float32).view(np.uint32)[0] >> 16


def test_q8_views_and_scales(tmp_path):
    m = ctxstore.Model(L, H, D, dtype=ctxstore.DTYPE_Q8)
    with ctxstore.Session.create(tmp_path / "q.ctxs", m, capacity=16) as s:
        append(s, [1, 2, 3])
        q = s.k(0)
        sc = s.k_scales(0)
        assert q.dtype == np.int8 and q.shape == (H, 16, D)
        assert sc.dtype == np.float32 and sc.shape == (H, 16)
        deq = q[:, 2].astype(np.float32) * sc[:, 2:3]
        ek = token_kv(2)[0][0]
        assert np.all(np.abs(deq - ek) <= sc[:, 2:3] / 2 + 1e-6)
        np.testing.assert_allclose(s.read_token(2)[0][0], deq, rtol=0, atol=1e-6)
        assert s.v_scales(1).shape == (H, 16)
        torch = pytest.importorskip("torch")
        assert s.torch_k(0).dtype == torch.int8
        assert s.torch_v_scales(1).dtype == torch.float32
    m16 = ctxstore.Model(L, H, D)
    with ctxstore.Session.create(tmp_path / "f.ctxs", m16, capacity=16) as s:
        with pytest.raises(ctxstore.Error, match="only a Q8 session"):
            s.k_scales(0)


def test_torch_views_share_memory(tmp_path, model):
    torch = pytest.importorskip("torch")
    with ctxstore.Session.create(tmp_path / "t.ctxs", model, capacity=16) as s:
        append(s, [1])
        t = s.torch_k(0)
        assert t.dtype == torch.float16 and tuple(t.shape) == (H, 16, D)
        r = s.reserve(1)
        t[:, r.slot(0)] = torch.full((H, D), 3.0, dtype=torch.float16)
        assert np.all(s.k(0)[:, r.slot(0)] == 3.0)
        s.close()
        assert float(t[0, 0, 1]) == float(token_kv(0)[0][0, 0, 1])


def test_views_index_and_write_errors(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "x.ctxs", model, capacity=16) as s:
        # Below 0 and past the last alike: the layer, and the range.
        for bad in (L, -1, 2**70):
            for view in (s.k, s.v):
                with pytest.raises(IndexError, match=f"layer {bad} out of range: the "
                                                     f"session has {L} layers, 0 to {L - 1}"):
                    view(bad)
        with pytest.raises(TypeError):
            s.k(1.5)
        k = s.k(0)
        with pytest.raises(ValueError):
            k[0, 0] = np.ones(D + 1)  # wrong shape into a view
        with pytest.raises(ValueError):
            k[0, 0] = "not a number"  # wrong dtype into a view
        with pytest.raises(ValueError):
            k[0, 0] = np.ones((2, D))
        k[0, 0] = np.ones(D, np.float64)  # numpy casts what it can


def test_readonly_open(tmp_path, model):
    path = tmp_path / "ro.ctxs"
    with ctxstore.Session.create(path, model, capacity=16) as w:
        append(w, [1, 2])
        with ctxstore.Session.open(path, readonly=True) as r:
            assert r.readonly and r.info().readonly and r.n_tokens == 2
            k = r.k(0)
            assert not k.flags.writeable
            with pytest.raises(ValueError):
                k[0, 0, 0] = 1
            with pytest.raises(ValueError):
                k.flags.writeable = True
            with pytest.raises(ctxstore.Error) as e:
                r.reserve(1)
            assert e.value.code == ctxstore.EREADONLY
            append(w, [3])
            assert r.n_tokens == 2
            r.refresh()
            assert r.n_tokens == 3 and r.tokens().tolist() == [1, 2, 3]


def test_second_writer_is_busy(tmp_path, model):
    path = tmp_path / "b.ctxs"
    with ctxstore.Session.create(path, model, capacity=16):
        with pytest.raises(ctxstore.Error) as e:
            ctxstore.Session.open(path, model)
        assert e.value.code == ctxstore.EBUSY and e.value.name == "CTXS_EBUSY"
        assert "another writer" in str(e.value) and "b.ctxs" in str(e.value)
    ctxstore.Session.open(path, model).close()


def test_open_errors(tmp_path, model):
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.open(tmp_path / "missing.ctxs", model)
    assert e.value.code == -errno.ENOENT and e.value.name == "ENOENT"
    (tmp_path / "junk").write_bytes(b"not a session" * 1000)
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.open(tmp_path / "junk", model)
    assert e.value.code == ctxstore.EFOREIGN
    path = tmp_path / "m.ctxs"
    ctxstore.Session.create(path, model, capacity=16).close()
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.open(path, model._replace(head_dim=32))
    assert e.value.code == ctxstore.EMODEL
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.open(path)  # a writer needs the model
    assert e.value.code == ctxstore.EINVAL
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.create(path, model)
    assert e.value.code == -errno.EEXIST
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.create(tmp_path / "z.ctxs", ctxstore.Model(0, 1, 1))
    assert e.value.code == ctxstore.EINVAL
    with pytest.raises(TypeError):
        ctxstore.Session()
    # A hash of the wrong length is refused where it is given.
    with pytest.raises(ValueError, match="model_hash is 16 bytes .*, not 5"):
        ctxstore.Model(1, 1, 8, model_hash=b"short")
    with pytest.raises(ValueError, match="tokenizer_hash is 16 bytes .*, not 17"):
        ctxstore.Model(1, 1, 8, tokenizer_hash=bytes(17))


def test_corrupt_header_is_ecorrupt(tmp_path, model):
    path = tmp_path / "c.ctxs"
    with ctxstore.Session.create(path, model, capacity=16) as s:
        append(s, [1, 2])
    with open(path, "r+b") as f:  # both commit records (FORMAT.md: 4096, 8192)
        for off in (4096, 8192):
            f.seek(off + 16)
            f.write(b"\xff" * 32)
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.open(path, model)
    assert e.value.code == ctxstore.ECORRUPT and e.value.name == "CTXS_ECORRUPT"
    assert "corrupt" in str(e.value)


def test_verify_names_the_bad_position(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "v.ctxs", model, capacity=16) as s:
        append(s, range(5))
        s.verify()
        s.k(1)[0, s.slot(3), 0] += 1  # a write outside any reservation
        with pytest.raises(ctxstore.Error) as e:
            s.verify()
        assert e.value.code == ctxstore.ECORRUPT and e.value.pos == 3
        assert "position 3" in str(e.value)
        s.verify(0, 3)
        with pytest.raises(ctxstore.Error):
            s.verify(from_pos=3)


def test_closed_session_refuses_every_call(tmp_path, model):
    s = ctxstore.Session.create(tmp_path / "c.ctxs", model, capacity=16)
    append(s, [1])
    r = s.reserve(1)
    s.close()
    s.close()  # idempotent
    assert s.closed and "closed" in repr(s)
    calls = [lambda: s.n_tokens, lambda: s.reserve(1), lambda: s.commit([1]),
             lambda: s.write_token(r, 0, *token_kv(0)), lambda: s.rollback(0),
             s.sync, s.refresh, s.verify, s.info, s.window, lambda: s.set_window(0),
             s.attn_plan, lambda: s.read_token(0), s.tokens, lambda: s.slot(0),
             lambda: s.k(0), lambda: s.v(0), lambda: s.torch_k(0), s.prefetch,
             lambda: s.capacity, lambda: s.fork(tmp_path / "f.ctxs")]
    for call in calls:
        with pytest.raises(ctxstore.Error) as e:
            call()
        assert e.value.code == ctxstore.EINVAL and "session is closed" in str(e.value)


def test_fork_file(tmp_path, model):
    with ctxstore.Session.create(tmp_path / "src.ctxs", model, capacity=16) as s:
        append(s, range(6))
        with s.fork(tmp_path / "dst.ctxs", 4) as f:
            assert f.n_tokens == 4 and f.tokens().tolist() == [0, 1, 2, 3]
            np.testing.assert_array_equal(f.read_token(3)[0], token_kv(3)[0])
        with s.fork(tmp_path / "all.ctxs") as f:
            assert f.n_tokens == 6


def test_threads_share_a_session_safely(tmp_path, model):
    """Calls on one session from several threads wait for each other; the
    GIL is released in commit and verify, so the readers run meanwhile."""
    with ctxstore.Session.create(tmp_path / "th.ctxs", model, capacity=4096,
                                 ring=False) as s:
        stop = threading.Event()
        errors = []

        def reader():
            try:
                while not stop.is_set():
                    n = s.n_tokens
                    if n:
                        s.verify(0, n)
                        s.tokens(0, n)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        for turn in range(40):
            append(s, range(turn * 8, turn * 8 + 8))
        stop.set()
        for t in threads:
            t.join()
        assert not errors
        assert s.n_tokens == 320


def test_views_follow_the_layer_schedule(tmp_path):
    # Layer 0 keeps a ring of its window (8) plus the batch (512); layer 1
    # is global, at the capacity.
    m = ctxstore.Model(L, H, D, model_hash=b"s" * 16, schedule=(8, 0))
    assert m.schedule == (8, 0)
    with ctxstore.Session.create(tmp_path / "s.ctxs", m, capacity=1024) as s:
        for first in range(0, 600, 100):
            append(s, range(first, first + 100))
        n = s.n_tokens
        assert s.info().model.schedule == (8, 0)
        ring = 8 + 512
        for layer in range(L):
            k, v = s.k(layer), s.v(layer)
            slots = ring if layer % 2 == 0 else 1024
            assert k.shape == (H, slots, D) and v.shape == (H, slots, D)
            # The last positions, each in its slot: p mod ring in a ring.
            for p in range(n - 8, n):
                slot = p % ring if layer % 2 == 0 else p
                want_k, want_v = token_kv(p)
                np.testing.assert_array_equal(k[:, slot, :].astype(np.float32), want_k[layer])
                np.testing.assert_array_equal(v[:, slot, :].astype(np.float32), want_v[layer])
            del k, v  # a view keeps the session's mapping, and so its lock
    # The model comes back with its schedule, and another schedule is
    # another model.
    with ctxstore.Session.open(tmp_path / "s.ctxs", m) as s:
        assert s.info().model == m
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.open(tmp_path / "s.ctxs", m._replace(schedule=(16, 0)))
    assert e.value.code == ctxstore.EMODEL
    with pytest.raises(ValueError):
        ctxstore.Model(L, H, D, schedule=(0, 0))
