#!/usr/bin/env python3
"""Submit an rlvr job through the HTTP API and follow it to its end (standard library only).

    python3 examples/python/submit_job.py JOB.toml [--server URL] [--token TOKEN]
                                          [--idempotency-key KEY]

The server defaults to $RLVR_SERVER (else http://127.0.0.1:8470), the token to $RLVR_TOKEN.
Needs Python 3.11 or newer (tomllib). A spec ending in .json is read as JSON.

What it does, as `rlvrctl submit --wait` does:
  1. reads the spec and makes the relative paths in data.train, data.heldout, data.canaries,
     model.policy, model.reference (unless `same` or `builtin:...`) and publish.registry
     absolute against the spec file's directory: the daemon reads them, from elsewhere;
  2. POSTs it to /v1/jobs as JSON (the standard library reads TOML but cannot write it), with an
     Idempotency-Key, so that a retried submit never makes a second job; prints the job id;
  3. follows GET /v1/jobs/{id}/events (server-sent events), printing each change of state and
     the training progress (at most every 5 s), reconnecting with Last-Event-ID when the
     connection drops (a daemon restart), until the job ends.

Exit status: 0 the job was published; 1 it ended otherwise (refused, failed, cancelled), with its
reason; 2 the daemon refused the request (the error's code, field and message are printed) or the
spec cannot be read; 3 the daemon cannot be reached or failed.
"""

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_SERVER = "http://127.0.0.1:8470"
# The spec fields that name files or directories, as (section, key).
PATH_FIELDS = [
    ("data", "train"),
    ("data", "heldout"),
    ("data", "canaries"),
    ("model", "policy"),
    ("model", "reference"),
    ("publish", "registry"),
]
TERMINAL = {"published", "refused", "failed", "cancelled"}
# The daemon sends a keep-alive every 10 s: a stream silent this long is dead.
STREAM_SILENCE_S = 35
PROGRESS_EVERY_S = 5
# How long to keep trying to get the event stream back (none opened) before giving up.
RECONNECT_GIVE_UP_S = 300


class Refused(Exception):
    """The daemon answered with an error status (exit 2 for 4xx, 3 for 5xx)."""

    def __init__(self, status, error):
        super().__init__(error.get("message", ""))
        self.status = status
        self.error = error

    def __str__(self):
        code = self.error.get("code", f"http_{self.status}")
        field = self.error.get("field")
        message = self.error.get("message", "")
        text = f"{code}: "
        # The daemon's spec messages name their field already.
        if field and not message.startswith(f"{field}: "):
            text += f"{field}: "
        text += message
        for problem in self.error.get("more", []):
            text += f"\n  {problem.get('field', '')}: {problem.get('message', '')}"
        return text


class Unreachable(Exception):
    """No answer from the daemon (exit 3)."""


def absolute_path(section, value, base):
    """The absolute form of one path field, or None to leave it as it is."""
    if not isinstance(value, str) or not value or "://" in value:
        return None
    if section == "model" and (value == "same" or value.startswith("builtin:")):
        return None
    if value == "~" or value.startswith("~/"):
        return os.path.expanduser(value)
    if os.path.isabs(value):
        return None
    while value.startswith("./"):
        value = value[2:]
    # `..` is kept, not folded: with symlinks, folding it can name another file.
    return os.path.join(base, value)


def read_spec(path):
    """The spec as a dict, its relative paths made absolute against its file's directory."""
    with open(path, "rb") as file:
        if path.endswith(".json"):
            spec = json.load(file)
        else:
            try:
                import tomllib
            except ImportError:
                sys.exit("submit_job.py: reading TOML needs Python 3.11 or newer (tomllib)")
            spec = tomllib.load(file)
    base = os.path.dirname(os.path.abspath(path))
    for section, key in PATH_FIELDS:
        table = spec.get(section)
        if isinstance(table, dict) and key in table:
            resolved = absolute_path(section, table[key], base)
            if resolved is not None:
                table[key] = resolved
    return spec


def request(server, token, method, path, body=None, headers=None, timeout=60):
    """Sends a request; returns the open response. Waits out a few 429/503 with Retry-After."""
    url = server.rstrip("/") + path
    all_headers = {"Authorization": f"Bearer {token}"} if token else {}
    all_headers.update(headers or {})
    for attempt in range(4):
        req = urllib.request.Request(url, data=body, method=method, headers=all_headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as error:
            retry_after = error.headers.get("Retry-After", "")
            if error.code in (429, 503) and retry_after.isdigit() and int(retry_after) <= 30 and attempt < 3:
                print(f"submit_job.py: daemon busy ({error.code}); retrying in {retry_after} s", file=sys.stderr)
                time.sleep(int(retry_after))
                continue
            text = error.read().decode("utf-8", "replace")
            try:
                api_error = json.loads(text)["error"]
            except (ValueError, KeyError, TypeError):
                api_error = {"code": f"http_{error.code}", "message": text.strip()[:200] or error.reason}
            raise Refused(error.code, api_error) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise Unreachable(f"cannot reach the daemon ({url}): {reason}") from None
    raise AssertionError("unreachable")


def submit(server, token, spec, idempotency_key):
    headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key}
    body = json.dumps(spec, default=str).encode()
    with request(server, token, "POST", "/v1/jobs", body, headers) as response:
        return json.load(response)


def clock(at):
    """12:00:01 from RFC 3339 (UTC)."""
    return at[11:19] if len(at) >= 19 and at[10] == "T" else at


def show_state(event):
    line = f"{clock(event['at'])} {event['state']}"
    if event.get("step"):
        line += f" at step {event['step']}"
    if event.get("reason"):
        line += f" — {event['reason']}"
    print(line, flush=True)


def show_progress(job):
    progress = job.get("progress") or {}
    line = f"{clock(job['updated_at'])} step {job['step']}/{job['max_steps']}"
    for key, label in [("reward", "reward"), ("heldout", "held-out"), ("kl", "KL")]:
        if progress.get(key) is not None:
            line += f" · {label} {progress[key]:.4g}"
    if progress.get("eta_s") is not None:
        line += f" · ETA {int(progress['eta_s'])} s"
    print(line, flush=True)


def read_events(response):
    """Yields (event, id, data) from a server-sent event stream; ends when the stream does."""
    event, data, event_id = "", [], None
    for raw in response:
        if not raw.endswith(b"\n"):
            return  # a cut connection: the last event is incomplete
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event or "message", event_id, "\n".join(data)
            event, data, event_id = "", [], None
            continue
        if line.startswith(":"):
            continue  # a comment: the daemon's keep-alive
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value


def follow(server, token, job_id):
    """Prints the job's events until its end; returns the final state event."""
    path = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}/events"
    # The give-up clock runs from the last stream opened: a queued job may send no event for hours.
    last_id, wait, last_open, last_progress = None, 0.5, time.monotonic(), 0.0
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_id:
            headers["Last-Event-ID"] = last_id
        try:
            with request(server, token, "GET", path, headers=headers, timeout=STREAM_SILENCE_S) as response:
                last_open = time.monotonic()
                for kind, event_id, data in read_events(response):
                    wait = 0.5
                    if event_id:
                        last_id = event_id
                    if kind == "state":
                        event = json.loads(data)
                        show_state(event)
                        if event["state"] in TERMINAL:
                            return event
                    elif kind == "progress":
                        job = json.loads(data)
                        now = time.monotonic()
                        if now - last_progress >= PROGRESS_EVERY_S or job["step"] >= job["max_steps"]:
                            last_progress = now
                            show_progress(job)
            why = "the daemon closed the stream"
        except Refused as error:
            if error.status < 500 and error.status != 429:
                raise
            why = str(error)
        except (Unreachable, OSError, http.client.HTTPException) as error:
            why = str(error) or type(error).__name__
        if time.monotonic() - last_open > RECONNECT_GIVE_UP_S:
            raise Unreachable(f"no stream for {RECONNECT_GIVE_UP_S} s ({why}); the job goes on")
        print(f"submit_job.py: {why}; reconnecting in {wait:.1f} s", file=sys.stderr)
        time.sleep(wait)
        wait = min(wait * 2, 10.0)


def main():
    parser = argparse.ArgumentParser(description="Submit an rlvr job and follow it to its end.")
    parser.add_argument("spec", metavar="JOB.toml", help="the job spec (TOML, or JSON when it ends in .json)")
    parser.add_argument("--server", default=os.environ.get("RLVR_SERVER") or DEFAULT_SERVER,
                        help="the daemon's API (default: $RLVR_SERVER, else %(default)s)")
    parser.add_argument("--token", default=os.environ.get("RLVR_TOKEN"),
                        help="the team's bearer token (default: $RLVR_TOKEN)")
    parser.add_argument("--idempotency-key",
                        help="makes a repeated submit answer with the first one's job (default: a fresh key)")
    args = parser.parse_args()
    if not args.token:
        print("submit_job.py: no token: pass --token or set RLVR_TOKEN", file=sys.stderr)
        return 2
    try:
        spec = read_spec(args.spec)
    except (OSError, ValueError) as error:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        print(f"submit_job.py: {args.spec}: {error}", file=sys.stderr)
        return 2
    key = args.idempotency_key or "submit_job-" + os.urandom(16).hex()
    try:
        submitted = submit(args.server, args.token, spec, key)
        print(submitted["id"], flush=True)
        if not submitted.get("created", True):
            print("submit_job.py: an earlier submit with this key made this job", file=sys.stderr)
        end = follow(args.server, args.token, submitted["id"])
    except Refused as error:
        print(f"submit_job.py: {error}", file=sys.stderr)
        return 2 if error.status < 500 else 3
    except Unreachable as error:
        print(f"submit_job.py: {error}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    if end["state"] == "published":
        return 0
    print(f"submit_job.py: job {submitted['id']} {end['state']}: {end.get('reason', '')}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
