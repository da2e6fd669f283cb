"""What the engine adapter lets go of at each start: tracebacks of import errors that vLLM keeps
in module globals (they held the frames that built an engine, and so the engine)."""

from __future__ import annotations

import sys
import types

import pytest

from appliance.adapters.vllm_engine import _drop_stored_import_tracebacks


class Engine:
    """Stands in for an engine that a frame of the import chain still refers to."""


def _import_optional(engine: Engine) -> BaseException:
    try:
        import appliance_no_such_package  # noqa: F401
    except ModuleNotFoundError as exc:
        return exc
    raise AssertionError("the package exists")


@pytest.fixture
def vllm_like_module():
    module = types.ModuleType("vllm_test_stored_error")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_stored_import_error_keeps_its_message_and_loses_its_frames(vllm_like_module):
    engine = Engine()
    vllm_like_module._import_exc = _import_optional(engine)
    frame = vllm_like_module._import_exc.__traceback__.tb_frame
    assert frame.f_locals["engine"] is engine  # what pinned an old engine before
    _drop_stored_import_tracebacks()
    exc = vllm_like_module._import_exc
    assert exc.__traceback__ is None
    assert str(exc) == "No module named 'appliance_no_such_package'"


def test_modules_outside_vllm_are_left_alone():
    here = sys.modules[__name__]
    here._kept = _import_optional(Engine())  # type: ignore[attr-defined]
    try:
        _drop_stored_import_tracebacks()
        assert here._kept.__traceback__ is not None  # type: ignore[attr-defined]
    finally:
        del here._kept  # type: ignore[attr-defined]
