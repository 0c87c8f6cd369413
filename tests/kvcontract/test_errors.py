"""kvcontract.errors: the exception hierarchy its docstring draws, and the messages."""

from __future__ import annotations

from importlib import metadata

import pytest

import kvcontract
from kvcontract import errors
from kvcontract.errors import (
    EngineUnavailableError,
    GeometryError,
    InputFileError,
    KvContractError,
    ProofError,
    UnknownClauseError,
    UnknownPropertyError,
    UnknownTargetError,
    UsageError,
    WitnessError,
)

PARENT = {
    KvContractError: Exception,
    UsageError: KvContractError,
    UnknownClauseError: UsageError,
    UnknownTargetError: UsageError,
    UnknownPropertyError: UsageError,
    GeometryError: KvContractError,
    InputFileError: KvContractError,
    WitnessError: KvContractError,
    ProofError: KvContractError,
    EngineUnavailableError: KvContractError,
}


@pytest.mark.parametrize(("cls", "parent"), list(PARENT.items()),
                         ids=[c.__name__ for c in PARENT])
def test_hierarchy(cls: type[Exception], parent: type[Exception]) -> None:
    assert cls.__bases__ == (parent,)


def test_every_error_class_is_listed() -> None:
    defined = {value for value in vars(errors).values()
               if isinstance(value, type) and issubclass(value, Exception)}
    assert defined == set(PARENT)
    doc = errors.__doc__ or ""
    for cls in PARENT:
        if cls is not KvContractError:
            assert f"+-- {cls.__name__}" in doc, cls.__name__


def test_geometry_error_is_not_a_usage_error() -> None:
    # The CLI maps both to exit 2, but callers catch geometry problems separately.
    assert not issubclass(GeometryError, UsageError)
    assert not issubclass(WitnessError, UsageError)


def test_unknown_clause_message() -> None:
    error = UnknownClauseError("C42", ["C1", "C2"])
    assert (error.clause, error.known) == ("C42", ["C1", "C2"])
    assert str(error) == "unknown clause 'C42'; known clauses: C1, C2"


def test_unknown_target_message() -> None:
    error = UnknownTargetError("nope", ["reference", "stale-pending"])
    assert (error.target, error.known) == ("nope", ["reference", "stale-pending"])
    assert str(error) == "unknown implementation 'nope'; choose one of: reference, stale-pending"


def test_geometry_error_message() -> None:
    error = GeometryError("sliding_window", 1, "must be >= 2")
    assert (error.field, error.value, error.rule) == ("sliding_window", 1, "must be >= 2")
    assert str(error) == "invalid geometry: sliding_window=1: must be >= 2"
    assert str(GeometryError("kind", "x", "bad")) == "invalid geometry: kind='x': bad"


def test_input_file_error_message() -> None:
    error = InputFileError("report.json", "not valid JSON")
    assert (error.path, error.problem) == ("report.json", "not valid JSON")
    assert str(error) == "cannot use report.json: not valid JSON"


def test_plain_messages() -> None:
    for cls in (UsageError, UnknownPropertyError, WitnessError, ProofError):
        assert str(cls("what went wrong")) == "what went wrong"


def test_package_reexports() -> None:
    for name in kvcontract.__all__:
        if hasattr(errors, name):  # the rest is the Python API (tests/kvcontract/test_api.py)
            assert getattr(kvcontract, name) is getattr(errors, name)
    assert kvcontract.__version__ == metadata.version("kvcontract")
