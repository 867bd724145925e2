"""The package as a user's editor and help() see it: every public name has
a docstring and a type stub."""

import ast
import inspect
import os

import pslite

STUB = os.path.join(os.path.dirname(pslite.__file__), "_pslite.pyi")


def stub_names():
    tree = ast.parse(open(STUB).read())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = set()
    return names


def test_every_native_name_has_a_stub_and_a_docstring():
    from pslite import _pslite

    stubs = stub_names()
    for name in dir(_pslite):
        if name.startswith("_"):
            continue
        assert name in stubs, f"{name} has no stub in _pslite.pyi"
        obj = getattr(_pslite, name)
        if inspect.isclass(obj) or callable(obj):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                assert attr in stubs[name], f"{name}.{attr} has no stub"
                assert (getattr(member, "__doc__", "") or "").strip(), f"{name}.{attr} has no doc"


def test_exceptions_are_named_after_rusts_failure_kinds():
    kinds = ["SchedulerLost", "NotAcknowledged", "PeerDead", "PeerRestarted", "Stopped",
             "HandlerPanicked", "ReceiveThreadDied", "SendFailed", "BadResponse",
             "AuthRefused", "RendezvousFailed", "LeftRound", "AppDropped", "RangeLost"]
    for kind in kinds:
        cls = getattr(pslite, kind)
        assert issubclass(cls, pslite.Failure) and issubclass(cls, pslite.Error)
    assert issubclass(pslite.Timeout, TimeoutError)
    assert issubclass(pslite.ConfigError, ValueError)
    assert issubclass(pslite.InvalidInput, ValueError)
