"""The transport under `Client`: one request with the team's token, busy answers (429, 503 with
Retry-After) waited out a few times as `rlvrctl` does, every failure one of `rlvr.errors`.
Standard library only (urllib): see the package README for why."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import IO, Any

from . import __version__
from .errors import ApiError, BadAnswer, Unreachable

#: Longest wait for an answer's head, then for each read of its body.
REQUEST_TIMEOUT_S = 60.0
# `POST /v1/env/check` plays episodes on the daemon: above its default dry-run budget (300 s).
ENV_CHECK_TIMEOUT_S = 360.0
#: An event stream this long silent is dead: the daemon sends a keep-alive every 10 s.
STREAM_SILENCE_S = 35.0
#: Busy answers (429, 503 with Retry-After) waited out per request.
BUSY_RETRIES = 3
#: The longest Retry-After waited out; a longer one is the caller's to judge.
BUSY_WAIT_MAX_S = 30.0

Body = bytes | IO[bytes] | None


def _retry_after(status: int, headers: Any) -> float | None:
    """How long a 429 or 503 answer asks us to wait, when it says (in seconds)."""
    if status not in (429, 503):
        return None
    value = (headers.get("Retry-After") or "").strip()
    return float(value) if value.isdigit() else None


class Transport:
    """Where the daemon is, who we are, and how patient to be."""

    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        timeout: float = REQUEST_TIMEOUT_S,
        busy_retries: int = BUSY_RETRIES,
        busy_wait_max: float = BUSY_WAIT_MAX_S,
        on_busy: Callable[[int, float], None] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(server)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"server: expected an http:// or https:// URL, got {server!r}")
        if parsed.username or parsed.password:
            raise ValueError("server: expected a URL without a user or password; the token goes in token=")
        if token is not None and not (token.isascii() and token.isprintable() and " " not in token and token):
            raise ValueError("token: expected visible ASCII characters only")
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.busy_retries = busy_retries
        self.busy_wait_max = busy_wait_max
        self.on_busy = on_busy
        self.user_agent = f"rlvr-python/{__version__}"

    def url(self, segments: Sequence[str], query: dict[str, Any] | None = None) -> str:
        """The server's URL with these path segments (each percent-encoded) and query pairs
        (None values left out)."""
        path = "/".join(urllib.parse.quote(str(segment), safe="") for segment in segments)
        url = f"{self.server}/{path}"
        pairs = [(key, str(value).lower() if isinstance(value, bool) else str(value))
                 for key, value in (query or {}).items() if value is not None]
        return url + ("?" + urllib.parse.urlencode(pairs) if pairs else "")

    def open(
        self,
        method: str,
        segments: Sequence[str],
        *,
        query: dict[str, Any] | None = None,
        body: Body = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> http.client.HTTPResponse:
        """Sends a request and returns the open answer (2xx); waits out a few busy answers; any
        error status raises its `ApiError`. A file body is sent from where it is at each try."""
        url = self.url(segments, query)
        all_headers = {"User-Agent": self.user_agent}
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        all_headers.update(headers or {})
        start = body.tell() if body is not None and not isinstance(body, bytes) else 0
        retries = 0
        while True:
            if body is not None and not isinstance(body, bytes):
                body.seek(start)
            request = urllib.request.Request(url, data=body, method=method, headers=all_headers)
            try:
                answer: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=timeout or self.timeout)
                return answer
            except urllib.error.HTTPError as answer:
                wait = _retry_after(answer.code, answer.headers)
                if wait is not None and retries < self.busy_retries and wait <= self.busy_wait_max:
                    answer.close()
                    retries += 1
                    if self.on_busy:
                        self.on_busy(answer.code, wait)
                    time.sleep(wait)
                    continue
                raise self._error(answer, url, wait) from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
                reason = getattr(error, "reason", None) or error
                raise Unreachable(f"cannot reach the daemon ({url}): {reason}") from None

    @staticmethod
    def _error(answer: urllib.error.HTTPError, url: str, wait: float | None) -> ApiError:
        try:
            text = answer.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        finally:
            answer.close()
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        return ApiError.of(answer.code, body, url, wait, text)

    def call(
        self,
        method: str,
        segments: Sequence[str],
        *,
        query: dict[str, Any] | None = None,
        json_body: Any = None,
        body: Body = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
        expect: Sequence[int] = (200,),
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A request whose answer is a JSON object (every answer of the API is one): returns
        (status, value). `timeout`: this request's, where it may take longer than most."""
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body, default=str).encode()
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        url = self.url(segments, query)
        with self.open(method, segments, query=query, body=body, headers=headers, timeout=timeout) as answer:
            try:
                text = answer.read()
            except (TimeoutError, OSError, http.client.HTTPException) as error:
                raise Unreachable(f"cannot read the answer of {url}: {error}") from None
            status = answer.status
        if status not in expect:
            raise BadAnswer(f"unexpected answer from {url}: expected {'/'.join(map(str, expect))}, got {status}")
        try:
            value = json.loads(text)
        except ValueError as error:
            raise BadAnswer(f"unexpected answer from {url}: not JSON ({error})") from None
        if not isinstance(value, dict):
            raise BadAnswer(f"unexpected answer from {url}: not a JSON object")
        return status, value
