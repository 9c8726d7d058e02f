"""Where validation/pde_reference.py stores a reference it computes: outside the
repository (the local cache), never in the tracked file, unless its own command runs."""

from __future__ import annotations

import numpy as np
import pytest


def test_a_computed_reference_goes_to_the_local_cache(tmp_path, monkeypatch):
    ref = pytest.importorskip("validation.pde_reference")
    tracked, local = tmp_path / "tracked.npz", tmp_path / "local" / "pde_reference.npz"
    np.savez_compressed(tracked, other=np.zeros(2))
    before = tracked.read_bytes()
    monkeypatch.setattr(ref, "CACHE", tracked)
    monkeypatch.setattr(ref, "LOCAL_CACHE", local)
    monkeypatch.setattr(ref, "WRITE_TO", None)
    prob = ref.problem("bruss1d", 50)
    calls = []

    def fake(p):  # the solve itself is not under test here: where its result goes is
        calls.append(p.key)
        return np.full(p.y0.shape, 3.0), "fake"

    monkeypatch.setattr(ref, "compute_reference", fake)
    np.testing.assert_array_equal(ref.reference(prob), 3.0)
    assert tracked.read_bytes() == before  # the tracked file is untouched
    with np.load(local) as data:
        np.testing.assert_array_equal(data[prob.key], 3.0)
    np.testing.assert_array_equal(ref.reference(prob, compute=False), 3.0)  # read back
    assert calls == [prob.key]  # and not computed again
    assert ref.reference_note(prob) == "fake"
