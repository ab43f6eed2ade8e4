"""What close() does to live views: the Session is closed for every call at
once; the file stays mapped (and a writer's lock held) until the last view
is gone, then ctxs_session_close() runs."""
import gc
import weakref

import numpy as np
import pytest

import ctxstore
from conftest import append, token_kv


def test_views_stay_valid_after_close(tmp_path, model):
    s = ctxstore.Session.create(tmp_path / "a.ctxs", model, capacity=16)
    append(s, [1, 2, 3])
    k, v = s.k(1), s.v(0)
    s.close()
    with pytest.raises(ctxstore.Error):
        s.k(0)
    np.testing.assert_array_equal(k[:, 2].astype(np.float32), token_kv(2)[0][1])
    np.testing.assert_array_equal(v[:, 1].astype(np.float32), token_kv(1)[1][0])
    k[0, 10, 0] = 1.0  # still mapped: writing is safe (and never committed)


def test_lock_held_until_last_view_is_gone(tmp_path, model):
    path = tmp_path / "b.ctxs"
    s = ctxstore.Session.create(path, model, capacity=16)
    append(s, [1])
    k = s.k(0)
    sub = k[0, :4]  # a view of a view keeps it too
    del k
    s.close()
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.Session.open(path, model)
    assert e.value.code == ctxstore.EBUSY
    del sub
    gc.collect()
    with ctxstore.Session.open(path, model) as s2:
        assert s2.n_tokens == 1


def test_view_outlives_session_object(tmp_path, model):
    path = tmp_path / "c.ctxs"
    s = ctxstore.Session.create(path, model, capacity=16)
    append(s, [1, 2])
    ref = weakref.ref(s)
    k = s.k(0)
    del s
    gc.collect()
    assert ref() is None
    np.testing.assert_array_equal(k[:, 1].astype(np.float32), token_kv(1)[0][0])
    with pytest.raises(ctxstore.Error):
        ctxstore.Session.open(path, model)  # the mapping (and lock) lives on in k
    del k
    ctxstore.Session.open(path, model).close()


def test_close_without_views_closes_at_once(tmp_path, model):
    path = tmp_path / "d.ctxs"
    s = ctxstore.Session.create(path, model, capacity=16)
    s.k(0)  # a temporary view, gone at once
    s.close()
    ctxstore.Session.open(path, model).close()


def test_gc_of_a_session_without_close(tmp_path, model):
    path = tmp_path / "e.ctxs"
    s = ctxstore.Session.create(path, model, capacity=16)
    append(s, [4, 5])
    del s
    gc.collect()
    with ctxstore.Session.open(path, model) as s:
        assert s.tokens().tolist() == [4, 5]


def test_torch_view_keeps_the_mapping(tmp_path, model):
    pytest.importorskip("torch")
    path = tmp_path / "f.ctxs"
    s = ctxstore.Session.create(path, model, capacity=16)
    append(s, [1, 2])
    t = s.torch_v(1)
    s.close()
    del s
    gc.collect()
    assert float(t[1, 1, 3]) == float(token_kv(1)[1][1, 1, 3])
    with pytest.raises(ctxstore.Error):
        ctxstore.Session.open(path, model)
    del t
    gc.collect()
    ctxstore.Session.open(path, model).close()


def test_store_outlives_close_while_its_sessions_live(tmp_path, model):
    st = ctxstore.Store(tmp_path / "st", create=True)
    st.register_model(model, "m")
    s = st.create_session("chat", model, capacity=16)
    append(s, [1, 2])
    k = s.k(0)
    st.close()
    assert st.closed
    with pytest.raises(ctxstore.Error):
        st.sessions()
    s.checkpoint("cp")  # the store handle itself is still open under s
    assert s.checkpoints()[0].name == "cp"
    s.close()
    del k, s
    gc.collect()
    with ctxstore.Store(tmp_path / "st") as st2:
        assert st2.session("chat").n_tokens == 2
