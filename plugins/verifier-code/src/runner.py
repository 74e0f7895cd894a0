# rlvr-code-runner: runs inside the sandbox, beside the solution it runs.
# It is NOT trusted: the solution shares its process and may replace any of it. Nothing here
# decides a verdict; in asserts mode it only answers calls with values, which the trusted
# evaluator compares with expectations this process never sees.
# Protocol: JSON lines; requests on fd 3, replies on fd 4. First request: {"mode", "code"}.
import builtins, json, os, sys

_B = builtins
_rin = os.fdopen(3, "rb")
_rout = None  # fd 4, asserts mode only
_handles = []
_ns = {}


def _reply(message):
    _rout.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    _rout.flush()


def _enc(value, depth=0):
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -(1 << 53) < value < (1 << 53) else {"int": format(value, "x")}
    if t is float:
        return value if value == value and value not in (float("inf"), float("-inf")) else {"float": repr(value)}
    if depth < 64:
        if t is list or t is tuple or t is set or t is frozenset:
            return {t.__name__: [_enc(item, depth + 1) for item in value]}
        if t is dict:
            return {"dict": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in value.items()]}
        if t is bytes:
            return {"bytes": value.hex()}
        if t is complex:
            return {"complex": [_enc(value.real), _enc(value.imag)]}
    _handles.append(value)
    return {"ref": len(_handles) - 1}


def _dec(value):
    t = type(value)
    if value is None or t in (bool, int, float, str):
        return value
    if t is dict and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "int":
            return int(inner, 16)
        if tag == "float":
            return float(inner)
        if tag == "list":
            return [_dec(v) for v in inner]
        if tag == "tuple":
            return tuple(_dec(v) for v in inner)
        if tag == "set":
            return {_dec(v) for v in inner}
        if tag == "frozenset":
            return frozenset(_dec(v) for v in inner)
        if tag == "dict":
            return {_dec(k): _dec(v) for k, v in inner}
        if tag == "bytes":
            return bytes.fromhex(inner)
        if tag == "complex":
            return complex(_dec(inner[0]), _dec(inner[1]))
        if tag == "ref":
            return _handles[inner]
        if tag == "name":
            return _ns[inner]
    raise TypeError("malformed value")


def _serve(request):
    op = request["op"]
    target = _dec(request["target"])
    if op == "call":
        args = [_dec(a) for a in request["args"]]
        kwargs = {k: _dec(v) for k, v in request["kwargs"]}
        return target(*args, **kwargs)
    if op == "getattr":
        return getattr(target, request["name"])
    if op == "getitem":
        return target[_dec(request["key"])]
    if op == "len":
        return len(target)
    if op == "bool":
        return bool(target)
    if op == "list":
        return list(target)
    if op == "contains":
        return _dec(request["value"]) in target
    raise ValueError("unknown op")


def _failure(error):
    kind = type(error)
    name = kind.__name__ if getattr(_B, kind.__name__, None) is kind else "Exception"
    try:
        text = str(error)[:500]
    except BaseException:
        text = "?"
    return {"raise": [name, text]}


def _main():
    hello = json.loads(_rin.readline())
    if hello["mode"] == "io":
        _rin.close()
        exec(compile(hello["code"], "solution.py", "exec"), {"__name__": "__main__", "__builtins__": _B})
        return
    global _rout
    _rout = os.fdopen(4, "wb")
    _ns.update({"__name__": "solution", "__builtins__": _B})
    try:
        exec(compile(hello["code"], "solution.py", "exec"), _ns)
    except BaseException as error:
        _reply(_failure(error))
        return
    _reply({"ok": None})
    for line in _rin:
        try:
            result = {"ok": _enc(_serve(json.loads(line)))}
        except BaseException as error:
            result = _failure(error)
        _reply(result)


# Without the site module (-S, for a fast start) these two would be missing.
_B.exit = _B.quit = sys.exit
_main()
