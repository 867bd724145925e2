"""Checks shared by the test nodes (imported from the node's own directory)."""

import pslite


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


def run_node(serve, work):
    """A test node's life: start; `serve(po)` on a server (returns its apps)
    or `work(po)` on a worker; finalize; close the apps. Returns the node."""
    po = pslite.Postoffice.from_env()
    po.start()
    apps = serve(po) if po.is_server else []
    if po.is_worker:
        work(po)
    po.finalize()
    for app in apps:
        app.close()
    return po
