#!/usr/bin/env python3
"""Submit an rlvr job through the HTTP API and follow it to its end (standard library only).

    python3 examples/python/submit_job.py JOB.toml [--server URL] [--token TOKEN]
                                          [--idempotency-key KEY]

The server defaults to $RLVR_SERVER (else http://127.0.0.1:8470), the token to $RLVR_TOKEN.
Needs Python 3.11 or newer (tomllib). A spec ending in .json is read as JSON.

What it does, as `rlvrctl submit --wait` does:
  1. reads the spec and uploads the local files named by data.train, data.heldout and
     data.canaries (relative to the spec file's directory) as the team's datasets
     (PUT /v1/datasets/NAME), naming them `dataset:NAME@SHA256` in the spec: the daemon reads no
     path a spec writes;
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
# The spec fields that may name local files: uploaded as datasets before the submit.
DATA_KEYS = ["train", "heldout", "canaries"]
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


def local_file(value, base):
    """The local file a data field names, or None for a dataset or data-root name."""
    if not isinstance(value, str) or not value or value.startswith(("dataset:", "root:")):
        return None
    return os.path.join(base, os.path.expanduser(value))


def dataset_name(path, key):
    """The dataset name for a local file: its stem, with characters outside the name rule as '-'."""
    stem = os.path.splitext(os.path.basename(path))[0].lstrip(".")
    name = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in stem)[:64]
    return name or key


def read_spec(path):
    """The spec as a dict, and the directory its relative data paths are read from."""
    with open(path, "rb") as file:
        if path.endswith(".json"):
            spec = json.load(file)
        else:
            try:
                import tomllib
            except ImportError:
                sys.exit("submit_job.py: reading TOML needs Python 3.11 or newer (tomllib)")
            spec = tomllib.load(file)
    return spec, os.path.dirname(os.path.abspath(path))


def upload_data(server, token, spec, base):
    """Uploads the spec's local data files as the team's datasets and names them in the spec."""
    data = spec.get("data")
    if not isinstance(data, dict):
        return
    for key in DATA_KEYS:
        path = local_file(data.get(key), base)
        if path is None:
            continue
        with open(path, "rb") as file:
            content = file.read()
        name = dataset_name(path, key)
        headers = {"Content-Type": "application/x-ndjson"}
        quoted = urllib.parse.quote(name, safe="")
        with request(server, token, "PUT", f"/v1/datasets/{quoted}", content, headers) as response:
            dataset = json.load(response)
        data[key] = f"dataset:{dataset['name']}@{dataset['sha256']}"


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
        spec, base = read_spec(args.spec)
    except (OSError, ValueError) as error:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        print(f"submit_job.py: {args.spec}: {error}", file=sys.stderr)
        return 2
    key = args.idempotency_key or "submit_job-" + os.urandom(16).hex()
    try:
        try:
            upload_data(args.server, args.token, spec, base)
        except OSError as error:
            print(f"submit_job.py: {args.spec}: {error}", file=sys.stderr)
            return 2
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
