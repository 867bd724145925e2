"""Checks shared by the test nodes (imported from the node's own directory)."""


def expect(cond, what):
    """Fails the node with `what` unless `cond`."""
    if not cond:
        raise AssertionError(what)


def raises(exc, fn, *args, **kw):
    """Calls `fn(*args, **kw)`, which must raise `exc`; returns the exception."""
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")
