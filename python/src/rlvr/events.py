"""Following a job: its server-sent event stream (`GET /v1/jobs/{id}/events`) read to the job's
final state, reconnecting with `Last-Event-ID` (nothing missed, nothing repeated) when the
stream drops or the daemon restarts, as `rlvrctl watch` does."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ._http import STREAM_SILENCE_S, Transport
from .errors import ApiError, BadAnswer, Unreachable
from .models import Job, JobEvent

#: How long `follow` tries to get a stream back (none opened) before it gives up.
RECONNECT_GIVE_UP_S = 300.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.5, 10.0


@dataclass
class SseEvent:
    #: `message` when the event named none.
    event: str
    #: The data lines, joined with `\n`.
    data: str


class SseParser:
    """The server-sent events parser of the WHATWG HTML spec (§9.2.6), fed one line at a time."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        #: The last complete event's id: what to send as `Last-Event-ID` when reconnecting.
        self.last_id: str | None = None

    def line(self, line: str) -> SseEvent | None:
        """Feeds one line, without its line ending; a blank line completes an event."""
        if not line:
            self.last_id = self._id
            event, data = self._event or "message", self._data
            self._event, self._data = "", []
            return SseEvent(event, "\n".join(data)) if data else None
        if line.startswith(":"):
            return None  # a comment: the daemon's keep-alive
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        return None

    def reconnect(self) -> None:
        """Forgets a half-received event (the connection dropped in its middle)."""
        self._event, self._data, self._id = "", [], self.last_id


def follow(
    transport: Transport,
    job_id: str,
    *,
    after: str | None = None,
    on_reconnect: Callable[[str, float], None] | None = None,
) -> Iterator[JobEvent | Job]:
    """Yields job `job_id`'s events (`JobEvent` for a change of state, `Job` for progress) until
    its final state, which is the last thing yielded. `after`: an event id to resume after."""
    parser = SseParser()
    parser.last_id = after
    parser.reconnect()
    wait = _BACKOFF_FIRST_S
    # The give-up clock runs from the first failure since a stream last said anything: a job may
    # wait queued for hours on one quiet, healthy stream.
    down_since: float | None = None
    segments = ["v1", "jobs", job_id, "events"]
    while True:
        parser.reconnect()
        headers = {"Accept": "text/event-stream"}
        if parser.last_id:
            headers["Last-Event-ID"] = parser.last_id
        server_wait = 0.0
        try:
            answer = transport.open("GET", segments, headers=headers, timeout=STREAM_SILENCE_S)
        except ApiError as error:
            if error.status < 500 and error.status != 429:
                raise
            why, server_wait = str(error), error.retry_after or 0.0
        except Unreachable as error:
            why = str(error)
        else:
            with answer:
                content_type = answer.headers.get("Content-Type", "")
                if not content_type.startswith("text/event-stream"):
                    raise BadAnswer(f"expected an event stream from {answer.url}, got {content_type!r}")
                alive = False
                why = "the daemon closed the stream"
                try:
                    for raw in answer:
                        if not raw.endswith(b"\n"):
                            break  # a cut connection: the last event is incomplete
                        if not alive:
                            alive, wait, down_since = True, _BACKOFF_FIRST_S, None
                        sse = parser.line(raw.decode("utf-8", "replace").rstrip("\r\n").lstrip("\ufeff"))
                        if sse is None:
                            continue
                        item = _parse(sse)
                        if item is not None:
                            yield item
                            if isinstance(item, JobEvent) and item.ended:
                                return
                except (OSError, http.client.HTTPException) as error:
                    why = f"the stream broke: {error or type(error).__name__}"
        now = time.monotonic()
        if down_since is None:
            down_since = now
        if now - down_since >= RECONNECT_GIVE_UP_S:
            raise Unreachable(f"no stream for {RECONNECT_GIVE_UP_S:.0f} s ({why}); the job goes on")
        pause = max(wait, server_wait)
        if on_reconnect:
            on_reconnect(why, pause)
        time.sleep(pause)
        wait = min(wait * 2, _BACKOFF_MAX_S)


def _parse(sse: SseEvent) -> JobEvent | Job | None:
    """A `state` or `progress` event's data; other events are ignored."""
    if sse.event not in ("state", "progress"):
        return None
    try:
        data = json.loads(sse.data)
        return JobEvent.from_json(data) if sse.event == "state" else Job.from_json(data)
    except (ValueError, KeyError, TypeError) as error:
        raise BadAnswer(f"a {sse.event} event the client cannot read: {error}") from None

