"""The launcher's worker outcome is a typed value: every PortableError crosses the process boundary
(pickled, as Ray does) and is rebuilt through its own constructor; failures render without re-parsing."""

from __future__ import annotations

import inspect
import pickle

import pytest

from reproduction import errors
from reproduction.train.launcher import WorkerFailure, WorkerOutcome

ERROR_TYPES = sorted(
    (c for c in vars(errors).values() if inspect.isclass(c) and issubclass(c, errors.PortableError)),
    key=lambda c: c.__name__,
)


@pytest.mark.parametrize("cls", ERROR_TYPES, ids=lambda c: c.__name__)
def test_every_portable_error_round_trips_through_a_worker_outcome(cls):
    try:
        raise cls("it broke at /x", hint="do this", path="/x", extra=3)
    except errors.PortableError as exc:
        outcome = pickle.loads(pickle.dumps(WorkerOutcome.of_error(exc)))
    with pytest.raises(cls) as info:
        outcome.unwrap()
    err = info.value
    assert type(err) is cls and err.message == "it broke at /x" and err.hint == "do this"
    assert err.path == "/x" and err.extra == 3 and err.exit_code == cls.exit_code
    assert "it broke at /x" in err.worker_traceback and "test_launcher_outcome.py" in err.worker_traceback


def test_a_value_outcome_unwraps_to_the_value():
    assert pickle.loads(pickle.dumps(WorkerOutcome(value={"step": 3}))).unwrap() == {"step": 3}


def test_failures_render_per_caller_without_parsing_text():
    raised = WorkerFailure(
        rank=1, died=False, summary="RuntimeError: boom", traceback="Traceback ...\nRuntimeError: boom"
    )
    died = WorkerFailure(rank=2, died=True, summary="WorkerCrashedError: gone", traceback="gone")
    one = raised.error("value inference shard")
    assert one.message == "value inference shard 1 raised RuntimeError: boom" and one.rank == 1
    assert one.traceback.endswith("RuntimeError: boom") and one.exit_code == 51
    assert died.error("value inference shard").message == "value inference shard 2 died: WorkerCrashedError: gone"
    assert raised.error().message.startswith("worker rank 1 raised:\nTraceback")
    assert died.error().message == "worker rank 2 died: WorkerCrashedError: gone" and "resume" in died.error().hint
