"""How pslite reads arguments that are not already arrays of the right dtype.

The native module sends a C-contiguous NumPy array of the right dtype as it
is (no copy); anything else comes here once, and is converted only when the
conversion loses nothing:

- keys: integers (an array of an integer dtype, or Python ints), none
  negative; floats are refused even when whole (a key is an id, not a
  number to round);
- lens: integers from 0 to 2**31 - 1;
- values: an array of another dtype only when every value converts exactly
  (float64 0.5 to float32, int64 3 to float32), unless the caller passes
  ``cast=True``; Python numbers (a list, a scalar) are rounded to the
  nearest value of the dtype, as ``torch.tensor`` does, but never overflow
  (1e40 is not a float32) and never lose a fraction into an integer.

Every refusal is an `InvalidInput` (a ValueError) naming the first bad
element.
"""

import numpy as np

from .errors import InvalidInput

_I32_MAX = 2**31 - 1


def _as_array(obj, what):
    if hasattr(obj, "detach") and hasattr(obj, "numpy"):  # a torch tensor
        obj = obj.detach()
        if getattr(obj, "device", None) is not None and obj.device.type != "cpu":
            obj = obj.cpu()
        return obj.numpy()
    try:
        return np.asarray(obj)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidInput(f"{what}: cannot be read as an array: {e}") from None


def _first(mask):
    return int(np.flatnonzero(mask.reshape(-1))[0])


def _integers(obj, what, dtype, low, high):
    """`obj` as a flat contiguous array of `dtype`, every element an integer
    in [low, high]."""
    a = _as_array(obj, what)
    if a.dtype == object:
        # Python ints beyond int64 (keys up to 2**64 - 1), or a mix.
        try:
            a = np.asarray(obj, dtype=np.uint64 if low >= 0 else np.int64)
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidInput(f"{what} must be integers from {low} to {high}: {e}") from None
    a = a.reshape(-1)
    if a.size == 0:
        return np.empty(0, dtype)
    if a.dtype.kind not in "iu":
        raise InvalidInput(
            f"{what} must be integers (an array of an integer dtype, or Python ints), "
            f"got {a.dtype.name} values such as {a[0].item()!r}")
    if a.dtype.kind == "i" and (a < low).any():
        i = _first(a < low)
        raise InvalidInput(f"{what} must be from {low} to {high}: {what}[{i}] = {a[i].item()}")
    if high < np.iinfo(a.dtype).max and (a > high).any():
        i = _first(a > high)
        raise InvalidInput(f"{what} must be from {low} to {high}: {what}[{i}] = {a[i].item()}")
    return np.ascontiguousarray(a, dtype)


def keys(obj):
    """Keys as numpy.uint64."""
    return _integers(obj, "keys", np.uint64, 0, 2**64 - 1)


def lens(obj):
    """Values per key as numpy.int32."""
    return _integers(obj, "lens", np.int32, 0, _I32_MAX)


def values(obj, dtype, cast=False, what="vals"):
    """Values as a flat contiguous array of `dtype` (see the module docs)."""
    dtype = np.dtype(dtype)
    typed = hasattr(obj, "dtype")
    a = _as_array(obj, what).reshape(-1)
    if a.dtype == dtype:
        return np.ascontiguousarray(a)
    if cast:
        try:
            return np.ascontiguousarray(a, dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidInput(f"{what}: cannot convert {a.dtype.name} to {dtype.name}: {e}") from None
    if a.size == 0:
        return np.empty(0, dtype)
    if a.dtype.kind not in "biuf":
        raise InvalidInput(f"{what} must be numbers of dtype {dtype.name}, got {a.dtype.name}")
    if np.can_cast(a.dtype, dtype, "safe"):
        return np.ascontiguousarray(a, dtype)
    with np.errstate(all="ignore"):
        converted = a.astype(dtype)
        if not typed and a.dtype.kind == "f" and dtype.kind == "f":
            # Python floats: rounded to the dtype, but never to inf.
            bad = np.isfinite(a) & ~np.isfinite(converted)
        else:
            back = converted.astype(a.dtype)
            bad = back != a
            if a.dtype.kind == "f":
                bad &= ~(np.isnan(a) & np.isnan(back))
                if dtype.kind in "iu":
                    bad |= ~np.isfinite(a)
    if bad.any():
        i = _first(bad)
        raise InvalidInput(
            f"{what}[{i}] = {a[i].item()!r} ({a.dtype.name}) is not exactly a {dtype.name} value "
            f"(it would become {converted[i].item()!r}): pass {dtype.name} values, or cast=True to "
            f"convert anyway")
    return np.ascontiguousarray(converted)
