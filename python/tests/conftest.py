"""Shared fixtures: real files in pytest's tmp_path, small geometries."""
import numpy as np
import pytest

import ctxstore

L, H, D = 2, 2, 16  # layers, KV heads, head dim: small and quick


@pytest.fixture
def model():
    return ctxstore.Model(L, H, D, model_hash=b"m" * 16)


def token_kv(pos, geometry=(L, H, D)):
    """The deterministic K and V of position pos (float32), exact in f16."""
    l, h, d = geometry
    base = np.arange(l * h * d, dtype=np.float32).reshape(l, h, d) / 64.0
    return base + (pos % 97) / 8.0, -(base + (pos % 89) / 4.0)


def append(s, ids, first=None, geometry=(L, H, D)):
    """One turn: reserve, write_token each, commit. Returns the reservation."""
    ids = list(ids)
    r = s.reserve(len(ids))
    for i in range(len(ids)):
        k, v = token_kv(r.first_pos + i, geometry)
        s.write_token(r, i, k, v)
    s.commit(ids)
    return r
