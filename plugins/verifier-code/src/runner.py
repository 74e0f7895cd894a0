# rlvr-code-runner: runs inside the sandbox, beside the solution it runs.
# It is NOT trusted: the solution shares its process and may replace any of it. Nothing here
# decides a verdict; in asserts mode it only answers calls with values, which the trusted
# evaluator compares with expectations this process never sees.
# Protocol: fd 3 brings "MODE NBYTES\n" and the solution's code; in asserts mode then one request
# per line (a Python literal from the trusted side), each answered on fd 4 by one JSON line.
# Only builtin modules are imported (no json, no os: they cost more than the interpreter's start).
import builtins as _B
import sys
from _json import encode_basestring_ascii as _jstr

_handles = []
_ns = {}
_INF = float("inf")


def _enc(value, depth=0):
    t = type(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is str:
        return _jstr(value)
    if t is int:
        return str(value) if -(1 << 53) < value < (1 << 53) else '{"int":"%s"}' % format(value, "x")
    if t is float:
        return repr(value) if value == value and value != _INF and value != -_INF else '{"float":"%r"}' % value
    if depth < 64:
        if t is list or t is tuple or t is set or t is frozenset:
            return '{"%s":[%s]}' % (t.__name__, ",".join([_enc(item, depth + 1) for item in value]))
        if t is dict:
            pairs = ["[%s,%s]" % (_enc(k, depth + 1), _enc(v, depth + 1)) for k, v in value.items()]
            return '{"dict":[%s]}' % ",".join(pairs)
        if t is bytes:
            return '{"bytes":"%s"}' % value.hex()
        if t is complex:
            return '{"complex":[%s,%s]}' % (_enc(value.real), _enc(value.imag))
    _handles.append(value)
    return '{"ref":%d}' % (len(_handles) - 1)


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
    raise ValueError("unknown op")


def _failure(error):
    kind = type(error)
    name = kind.__name__ if getattr(_B, kind.__name__, None) is kind else "Exception"
    try:
        text = str(error)[:500]
    except BaseException:
        text = "?"
    return '{"raise":[%s,%s]}' % (_jstr(name), _jstr(text))


def _main():
    rin = open(3, "rb")
    mode, size = rin.readline().split()
    code = rin.read(int(size)).decode("utf-8", "replace")
    if mode == b"io":
        rin.close()
        exec(compile(code, "solution.py", "exec"), {"__name__": "__main__", "__builtins__": _B})
        return
    rout = open(4, "wb")

    def reply(text):
        rout.write(text.encode() + b"\n")
        rout.flush()

    _ns.update({"__name__": "solution", "__builtins__": _B})
    try:
        exec(compile(code, "solution.py", "exec"), _ns)
    except BaseException as error:
        reply(_failure(error))
        return
    reply('{"ok":null}')
    literal_scope = {"__builtins__": {}}
    for line in rin:
        try:
            result = '{"ok":%s}' % _enc(_serve(eval(line, literal_scope)))
        except BaseException as error:
            result = _failure(error)
        reply(result)


# Without the site module (-S, for a fast start) these two would be missing.
_B.exit = _B.quit = sys.exit
_main()
