# rlvr-code-evaluator: the TRUSTED half of an asserts run. It holds the tests and never runs
# solution code: every name a test uses that is not a builtin, a standard module from the short
# list below, or bound by the tests themselves, is a proxy. Calling a proxy sends (name, args)
# to the sandboxed solution through the host and gets back a plain value (int, float, str, bool,
# None, list, tuple, dict, set, frozenset, bytes, complex) decoded into a fresh object here; any
# other object stays in the sandbox as an opaque handle that equals nothing. So `__eq__` tricks,
# patched builtins or an early exit in the solution cannot make a comparison pass: comparisons
# happen here, on values the solution had to compute.
# Protocol (JSON lines, stdin/stdout, with the host): in {"setup", "tests", "explain"}; out
# {"begin": i} before test i, {"call": op as a Python literal} answered by {"reply": r} or {"gone": why},
# {"end": {"passed", "detail"}} after each test (so the host knows the results so far when it has
# to stop us), and last {"done": n} (n tests ended).
# The host holds us to the test's deadline once the solution has answered a call: the time we
# spend on its values (decoding, hashing them into a set) is the solution's time.
import ast, builtins, importlib, json, operator, os, sys

_proto_in = os.fdopen(os.dup(0), "rb")
_proto_out = os.fdopen(os.dup(1), "wb")
# Tests that print or read must not touch the protocol.
_devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(_devnull, 0)
os.dup2(_devnull, 1)
sys.stdin = open(os.devnull)
sys.stdout = open(os.devnull, "w")

STDLIB = {
    "math", "cmath", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
    "fractions", "decimal", "statistics", "operator", "random", "copy", "datetime", "json", "typing",
}
OPS = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}


class Gone(BaseException):
    """The sandbox ended (timeout, crash): no test after this one can pass. A BaseException so
    that a test's `except Exception` does not swallow it."""


class RemoteError(Exception):
    """The solution raised an exception that is not a builtin one, or answered nonsense."""


class Refused(Exception):
    """A reply that is well-formed but too costly to take in."""


class State:
    gone = None


# Distinct values with the same hash make building a set or dict quadratic (36,000 ints
# `(2**61-1)*k+5` cost seconds): a set, frozenset or dict from the solution with more than this
# many keys sharing a hash with another key is refused before it is built. Honest data has ~none.
MAX_HASH_COLLISIONS = 1000


def send(message):
    _proto_out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    _proto_out.flush()


def recv():
    line = _proto_in.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def short(value):
    try:
        text = repr(value)
    except BaseException:
        text = "<unprintable>"
    return text if len(text) <= 200 else text[:200] + "..."


def enc(value, depth=0):
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -(1 << 53) < value < (1 << 53) else {"int": format(value, "x")}
    if t is float:
        return value if value == value and abs(value) != float("inf") else {"float": repr(value)}
    if t is Remote:
        return value._target
    if depth < 64:
        if t in (list, tuple, set, frozenset):
            return {t.__name__: [enc(item, depth + 1) for item in value]}
        if t is dict:
            return {"dict": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in value.items()]}
        if t is bytes:
            return {"bytes": value.hex()}
        if t is complex:
            return {"complex": [value.real, value.imag]}
    raise TypeError(f"cannot pass a {t.__name__} to the solution")


def dec(value):
    t = type(value)
    if value is None or t in (bool, int, float, str):
        return value
    if t is dict and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "int" and type(inner) is str:
            return int(inner, 16)
        if tag == "float" and type(inner) is str:
            return float(inner)
        if tag in ("list", "tuple") and type(inner) is list:
            return (list if tag == "list" else tuple)(dec(v) for v in inner)
        if tag in ("set", "frozenset") and type(inner) is list:
            items = [dec(v) for v in inner]
            check_hashes(items)
            return (set if tag == "set" else frozenset)(items)
        if tag == "dict" and type(inner) is list:
            pairs = [(dec(k), dec(v)) for k, v in inner]
            check_hashes([k for k, _ in pairs])
            return dict(pairs)
        if tag == "bytes" and type(inner) is str:
            return bytes.fromhex(inner)
        if tag == "complex" and type(inner) is list and len(inner) == 2:
            return complex(float(dec(inner[0])), float(dec(inner[1])))
        if tag == "ref" and type(inner) is int:
            return Remote({"ref": inner}, "object")
    raise ValueError("malformed value")


def check_hashes(keys):
    if len(keys) <= MAX_HASH_COLLISIONS:
        return
    # A hash is an int below 2**61 - 1 in size, whose own hash is itself: this set cannot collide.
    hashes = set(map(hash, keys))
    if len(keys) - len(hashes) > MAX_HASH_COLLISIONS:
        raise Refused(
            f"refused a set/dict with {len(keys) - len(hashes)} keys whose hashes collide"
            f" (at most {MAX_HASH_COLLISIONS})"
        )


def call(op, label):
    if State.gone:
        raise Gone(State.gone)
    # A Python literal: the sandbox reads it with eval() and no builtins, which needs no import.
    send({"call": repr(op)})
    message = recv()
    if "gone" in message:
        State.gone = str(message["gone"])
        raise Gone(State.gone)
    reply = message.get("reply")
    if type(reply) is dict and len(reply) == 1:
        if "ok" in reply:
            try:
                return dec(reply["ok"])
            except Refused as error:
                raise RemoteError(f"{label}: {error}") from None
            except Exception:
                raise RemoteError(f"{label}: malformed value from the solution") from None
        failure = reply.get("raise")
        if type(failure) is list and len(failure) == 2 and all(type(part) is str for part in failure):
            name, text = failure
            kind = getattr(builtins, name, None)
            # StopIteration would end the iteration a test is running (`all(map(f, xs))` would
            # pass on a solution that raises it), so it stays a plain failure.
            if (
                isinstance(kind, type)
                and issubclass(kind, Exception)
                and not issubclass(kind, (StopIteration, StopAsyncIteration))
            ):
                try:
                    error = kind(text)
                except Exception:
                    error = RemoteError(f"{name}: {text}")
            else:
                error = RemoteError(f"{name}: {text}")
            raise error
    raise RemoteError(f"{label}: malformed reply from the solution")


class Remote:
    """A name or object that lives in the sandbox."""

    __slots__ = ("_target", "_label")

    def __init__(self, target, label):
        self._target = target
        self._label = label

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        label = f"{self._label}.{name}"
        return call({"op": "getattr", "target": self._target, "name": name}, label)

    def __call__(self, *args, **kwargs):
        op = {
            "op": "call",
            "target": self._target,
            "args": [enc(a) for a in args],
            "kwargs": [[k, enc(v)] for k, v in kwargs.items()],
        }
        return call(op, f"{self._label}()")

    def __getitem__(self, key):
        return call({"op": "getitem", "target": self._target, "key": enc(key)}, f"{self._label}[]")

    def __len__(self):
        n = call({"op": "len", "target": self._target}, f"len({self._label})")
        if type(n) is not int or n < 0:
            raise TypeError("len() of a solution object is not a non-negative int")
        return n

    def __bool__(self):
        b = call({"op": "bool", "target": self._target}, f"bool({self._label})")
        if type(b) is not bool:
            raise TypeError("bool() of a solution object is not a bool")
        return b

    def __iter__(self):
        items = call({"op": "list", "target": self._target}, f"list({self._label})")
        if type(items) is not list:
            raise TypeError("list() of a solution object is not a list")
        return iter(items)

    def __contains__(self, value):
        # Decided here, on the items the solution lists: asking the solution would hand it the
        # very value the test looks for (and a `__contains__` that says yes to anything).
        return value in list(self)

    def __repr__(self):
        return f"<solution's {self._label}>"


def free_names(trees):
    loaded, bound = set(), set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    return sorted(loaded - bound)


def outcome(passed, explain, detail):
    return {"passed": passed, "detail": detail if explain else ""}


def run_test(tree, ns, explain):
    if State.gone:
        return outcome(False, explain, f"not run: the sandbox {State.gone}")
    if isinstance(tree, SyntaxError):
        return outcome(False, explain, f"the test does not parse: {tree.msg}")
    body = tree.body
    try:
        if (
            len(body) == 1
            and isinstance(body[0], ast.Assert)
            and isinstance(body[0].test, ast.Compare)
            and len(body[0].test.ops) == 1
        ):
            # Evaluated in Python's own order, left then right, but kept apart for the report.
            compare = body[0].test
            left = eval(compile(ast.Expression(compare.left), "<test>", "eval"), ns)
            right = eval(compile(ast.Expression(compare.comparators[0]), "<test>", "eval"), ns)
            if OPS[type(compare.ops[0])](left, right):
                result = outcome(True, explain, "")
            else:
                detail = f"got {short(left)}, expected {short(right)}" if explain else ""
                result = outcome(False, explain, detail)
        else:
            exec(compile(tree, "<test>", "exec"), ns)
            result = outcome(True, explain, "")
    except Gone:
        result = outcome(False, explain, f"the sandbox {State.gone}")
    except AssertionError as error:
        result = outcome(False, explain, f"assertion failed{': ' + short(error) if str(error) else ''}")
    except BaseException as error:
        result = outcome(False, explain, f"{type(error).__name__}: {short(str(error))}")
    if State.gone and result["passed"]:
        # A test that swallowed the end of the sandbox does not pass.
        result = outcome(False, explain, f"the sandbox {State.gone}")
    return result


def run_job(job):
    explain = bool(job.get("explain"))
    State.gone = None
    ns = {"__builtins__": builtins, "__name__": "__tests__"}
    trees = []
    for index, source in enumerate([job.get("setup", "")] + list(job["tests"])):
        try:
            trees.append(ast.parse(source, filename=f"<test {index}>"))
        except SyntaxError as error:
            trees.append(error)
        except Exception as error:  # ValueError for NUL bytes, RecursionError for deep nesting
            trees.append(SyntaxError(f"{type(error).__name__}: {error}"))
    setup, tests = trees[0], trees[1:]
    for name in free_names([tree for tree in trees if isinstance(tree, ast.AST)]):
        if hasattr(builtins, name):
            continue
        if name in STDLIB:
            ns[name] = importlib.import_module(name)
        else:
            ns[name] = Remote({"name": name}, name)
    try:
        if isinstance(setup, SyntaxError):
            raise setup
        exec(compile(setup, "<setup>", "exec"), ns)
    except BaseException as error:
        detail = f"setup failed: {type(error).__name__}: {short(str(error))}"
        for _ in tests:
            send({"end": outcome(False, explain, detail)})
        return
    for index, tree in enumerate(tests):
        send({"begin": index})
        result = run_test(tree, ns, explain)
        send({"end": result})


def main():
    while True:
        job = recv()
        run_job(job)
        send({"done": len(job["tests"])})


main()
