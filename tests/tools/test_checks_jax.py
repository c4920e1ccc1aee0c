"""mldist doctor's JAX line: jax's and jaxlib's versions beside TensorFlow's, a fail where the backend needs them."""

from __future__ import annotations

import importlib.metadata

import pytest

from mldist.tools import checks


def test_the_versions_are_shown_where_jax_is_installed() -> None:
    ((name, status, detail, _fix),) = checks._jax_result({"HOME": "/nonexistent"})
    assert (name, status) == ("JAX", "ok")
    assert (
        detail == f"jax {importlib.metadata.version('jax')} and jaxlib {importlib.metadata.version('jaxlib')} installed"
    )


def test_a_missing_jax_fails_only_where_the_backend_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def none(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", none)
    assert checks._jax_result({"HOME": "/nonexistent"}) == []
    ((_, status, detail, fix),) = checks._jax_result({"KERAS_BACKEND": "jax", "HOME": "/nonexistent"})
    assert status == "fail" and detail == "KERAS_BACKEND=jax but jax and jaxlib not installed" and "mldist[jax]" in fix
