# rlvr-python-runner: runs inside the sandbox. This process (the sandbox's first) reads the
# input, forks, and forwards one result line; the grader's code runs only in the forked child,
# which holds neither the input fd nor the result fd: printing, writing to any fd it has, or
# exiting early cannot put a line on the result channel. Its way to a score is returning one
# from grade(): a line written into its own pipe to us besides that makes the item an error.
# (A grader that writes one well-formed line there and exits without returning sets its own
# score, as returning it would: inside one process nothing can tell the two apart.)
# Protocol: fd 3 brings "NSOURCE NSAMPLE NITEM\n", then the grader's source and the sample as
# UTF-8 and the item as a Python literal the host made from the item's JSON (so no json import:
# it would cost more than the interpreter's start). fd 4 gets exactly one JSON line:
#   {"score": X} | {"error": {"kind": K, "message": M}} | {"ended": WAIT_STATUS}
# Only builtin modules are imported.
import builtins as _B
import posix
import sys
from _json import encode_basestring_ascii as _jstr

_type, _float, _repr, _str, _len = type, float, float.__repr__, str, len
_INF = _float("inf")
_MESSAGE_MAX = 500
# Largest line the child may send us; the host bounds it again.
_LINE_MAX = 8192


def _error(kind, message):
    if _len(message) > _MESSAGE_MAX:
        message = message[:_MESSAGE_MAX] + "..."
    return '{"error":{"kind":%s,"message":%s}}' % (_jstr(kind), _jstr(message))


def _last_line(error):
    """`Type: message (grader.py, line N)`: the last line of the traceback, where it was raised."""
    try:
        text = _str(error)
    except BaseException:
        text = "?"
    name = _type(error).__name__
    where = ""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = " (%s, line %d)" % (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    return (name + ": " + text if text else name) + where


def _grade(source, sample, item):
    try:
        code = compile(source, "grader.py", "exec")
    except SyntaxError as error:
        return _error("syntax", "SyntaxError: %s (grader.py, line %s)" % (error.msg, error.lineno))
    except BaseException as error:
        return _error("syntax", _last_line(error))
    scope = {"__name__": "grader", "__builtins__": _B}
    try:
        exec(code, scope)
    except BaseException as error:
        return _error("exception", _last_line(error))
    grade = scope.get("grade")
    if not callable(grade):
        return _error("no_grade", "the source defines no function grade(sample, item)")
    try:
        value = grade(sample, item)
    except BaseException as error:
        return _error("exception", _last_line(error))
    kind = _type(value)
    if kind is bool:
        value = 1.0 if value else 0.0
    elif kind is int:
        try:
            value = _float(value)
        except OverflowError:
            return _error("return", "grade returned an int too large for a float; expected a finite number")
    elif kind is not float:
        return _error(
            "return", "grade returned %s; expected a finite number (float, int or bool)" % kind.__name__
        )
    if value != value or value == _INF or value == -_INF:
        return _error("return", "grade returned %s; expected a finite number" % _repr(value))
    return '{"score":%s}' % _repr(value)


def _write_all(fd, data):
    while data:
        data = data[posix.write(fd, data):]


def _child(source, sample, item, write_fd):
    # Set before any grader code runs: the reply fd and the input are the parent's alone.
    posix.close(4)
    line = _grade(source, sample, item)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        _write_all(write_fd, line.encode("ascii") + b"\n")
    finally:
        posix._exit(0)


def _main():
    rin = open(3, "rb")
    sizes = rin.readline().split()
    source = rin.read(int(sizes[0])).decode("utf-8", "replace")
    sample = rin.read(int(sizes[1])).decode("utf-8", "replace")
    item = eval(rin.read(int(sizes[2])).decode("ascii"), {"__builtins__": {}})
    rin.close()
    read_fd, write_fd = posix.pipe()
    pid = posix.fork()
    if pid == 0:
        posix.close(read_fd)
        _child(source, sample, item, write_fd)
    posix.close(write_fd)
    # The child writes its one line and exits; a grader that wrote into that pipe itself made it
    # more than one line. So: wait for the child, then take what the pipe holds, which must be
    # exactly one line. (Processes the grader forked may hold the pipe open: no waiting for EOF.)
    status = posix.waitpid(pid, 0)[1]
    posix.set_blocking(read_fd, False)
    data = b""
    while _len(data) <= _LINE_MAX:
        try:
            chunk = posix.read(read_fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    lines = data.split(b"\n")
    if _len(lines) == 2 and lines[0] and not lines[1]:
        reply = lines[0]
    elif data:
        reply = _error(
            "forged", "the grader wrote to its own result pipe; only returning from grade() sets the score"
        ).encode("ascii")
    else:
        reply = b'{"ended":%d}' % status
    _write_all(4, reply + b"\n")
    posix._exit(0)


_B.exit = _B.quit = sys.exit
_main()
