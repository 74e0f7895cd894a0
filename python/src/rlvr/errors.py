"""The exceptions of the rlvr client: the daemon's refusals with its code, field and message; the
daemon away or unreadable; a spec or a download that is wrong on this side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RlvrError(Exception):
    """Every error this package raises."""


@dataclass(frozen=True)
class FieldProblem:
    """One more problem of a refused spec (the API's `more`)."""

    field: str
    message: str


class ApiError(RlvrError):
    """The daemon answered with an error status and its `{"error": {...}}` body (or, from
    something that is not the daemon, a body made from the status)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        more: list[FieldProblem] | None = None,
        *,
        retry_after: float | None = None,
        url: str = "",
        from_daemon: bool = True,
    ) -> None:
        super().__init__(message)
        #: The HTTP status.
        self.status = status
        #: Stable, for programs: `invalid_spec`, `unauthorized`, `not_found`, …
        self.code = code
        self.message = message
        #: The field at fault (`optimizer.lr`), when there is one.
        self.field = field
        #: Every other problem found at once.
        self.more = list(more or [])
        #: The answer's Retry-After in seconds (429, 503), when it had one.
        self.retry_after = retry_after
        self.url = url
        #: Whether the body was the daemon's own error (false: a proxy's page).
        self.from_daemon = from_daemon

    def __str__(self) -> str:
        text = f"{self.code}: "
        # The daemon's spec messages name their field already.
        if self.field and not self.message.startswith(f"{self.field}: "):
            text += f"{self.field}: "
        text += self.message
        for problem in self.more:
            text += f"\n  {problem.field}: {problem.message}"
        return text

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(status={self.status}, code={self.code!r}, field={self.field!r}, "
                f"message={self.message!r})")

    @staticmethod
    def of(status: int, body: Any, url: str, retry_after: float | None, text: str) -> ApiError:
        """The error of the class for `status`, from the daemon's body when it is one."""
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            more = [
                FieldProblem(str(p.get("field", "")), str(p.get("message", "")))
                for p in error.get("more") or []
                if isinstance(p, dict)
            ]
            code, message, field, from_daemon = (
                error["code"], str(error.get("message", "")), error.get("field"), True)
        else:
            snippet = text.strip()[:200]
            code, message, field, more, from_daemon = (
                f"http_{status}", snippet or f"{status} from {url}", None, [], False)
        return _class_of(status)(status, code, message, field, more,
                                 retry_after=retry_after, url=url, from_daemon=from_daemon)


class Invalid(ApiError):
    """400 or 422: the request (a spec, a name, a query) is wrong; `field` says where."""


class Unauthorized(ApiError):
    """401: no token, or one the daemon does not know."""


class Forbidden(ApiError):
    """403: the token's team may not do this."""


class NotFound(ApiError):
    """404: no such thing, or it is another team's (the daemon says not which)."""


class Conflict(ApiError):
    """409: the thing's state does not allow it (a job that has ended)."""


class TooLarge(ApiError):
    """413: the body is over the daemon's limit."""


class RateLimited(ApiError):
    """429 once the retries are spent: over the team's rate, `retry_after` says when to return."""


class ServerError(ApiError):
    """5xx: the daemon failed (or is unavailable)."""


def _class_of(status: int) -> type[ApiError]:
    classes: dict[int, type[ApiError]] = {
        400: Invalid, 422: Invalid, 401: Unauthorized, 403: Forbidden, 404: NotFound,
        409: Conflict, 413: TooLarge, 429: RateLimited,
    }
    if status >= 500:
        return ServerError
    return classes.get(status, ApiError)


class Unreachable(RlvrError):
    """No answer: the connection was refused or cut, the name does not resolve, a timeout."""


class BadAnswer(RlvrError):
    """An answer this client cannot read: another version of the daemon, or not a daemon."""


class SpecError(RlvrError, ValueError):
    """A spec that cannot be read or prepared on this side (a data file that cannot be read);
    `field` names the spec's field when there is one (`data.train`)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class IntegrityError(RlvrError):
    """A downloaded file whose SHA-256 is not the one its manifest names."""

    def __init__(self, file: str, expected: str, got: str) -> None:
        super().__init__(f"{file}: sha256 {got}, the manifest says {expected}")
        self.file = file
        self.expected = expected
        self.got = got
