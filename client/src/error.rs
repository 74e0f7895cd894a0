//! A failed request, classified the way a program reports it: refused by the daemon (4xx), or
//! the daemon away, failing or answering something unreadable.

use std::time::Duration;

use reqwest::StatusCode;
use rlvr_protocol::job::ApiError;

/// The exit statuses of rlvr's command-line clients (`rlvrctl`; the Python example follows them
/// too): what kind of end a command came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done (for a followed job: it was published).
    Done,
    /// The followed job ended without being published; also any failure not classified below.
    Ended,
    /// The daemon refused the request (4xx), or the input on this side is wrong.
    Refused,
    /// The daemon cannot be reached, failed (5xx), or answered something unreadable.
    Unreachable,
}

impl Exit {
    /// The process's exit status: 0, 1, 2 or 3.
    pub fn code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::Ended => 1,
            Exit::Refused => 2,
            Exit::Unreachable => 3,
        }
    }
}

/// A failed request.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// No answer: refused connection, unknown host, timeout, a cut connection.
    #[error("cannot reach the daemon ({url}): {detail}")]
    Unreachable {
        /// The request's URL.
        url: String,
        /// The transport's error chain.
        detail: String,
    },
    /// An answer this client cannot read (another version of the daemon, or not a daemon).
    #[error("unexpected answer from {url}: {detail} (is the server an rlvrd of this rlvrctl's version?)")]
    BadAnswer {
        /// The request's URL.
        url: String,
        /// What was wrong with it.
        detail: String,
    },
    /// An error status, with the daemon's error body (or one made from the status).
    #[error("{}{}", api_error_text(error), hint.as_ref().map(|hint| format!("\n  ({hint})")).unwrap_or_default())]
    Status {
        /// The status.
        status: StatusCode,
        /// What went wrong.
        error: Box<ApiError>,
        /// Whether `error` is the daemon's own `{"error": …}` body; false when it was made from
        /// the status and whatever text came (a proxy, another server).
        from_daemon: bool,
        /// What to do about it (a 401: where the token came from, or where to put one).
        hint: Option<String>,
        /// The answer's Retry-After (429, 503), when it has one.
        retry_after: Option<Duration>,
    },
    /// The request could not be made from what was given (a header value that cannot be sent).
    #[error("cannot send a request to {url}: {detail}")]
    Request {
        /// The request's URL.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// The HTTP client could not be built (no TLS backend).
    #[error("cannot build the HTTP client: {detail}")]
    Setup {
        /// Why.
        detail: String,
    },
}

impl HttpError {
    /// The exit status a command ends with on this error.
    pub fn exit(&self) -> Exit {
        match self {
            HttpError::Status { status, .. } if !status.is_server_error() => Exit::Refused,
            HttpError::Request { .. } => Exit::Refused,
            HttpError::Setup { .. } => Exit::Ended,
            _ => Exit::Unreachable,
        }
    }

    /// Worth trying again later: the daemon is away, failing, or busy.
    pub fn is_transient(&self) -> bool {
        match self {
            HttpError::Status { status, .. } => {
                status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS
            }
            HttpError::Unreachable { .. } | HttpError::BadAnswer { .. } => true,
            HttpError::Request { .. } | HttpError::Setup { .. } => false,
        }
    }

    /// How long the daemon asked us to wait before trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            HttpError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The error status, when the daemon answered with one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A few words for a status line: `Connection refused (os error 111)`, `503 redis_unavailable`.
    pub fn short(&self) -> String {
        match self {
            HttpError::Unreachable { detail, .. } | HttpError::Request { detail, .. } => {
                detail.rsplit(": ").next().unwrap_or(detail).to_owned()
            }
            HttpError::BadAnswer { .. } => "unexpected answer".to_owned(),
            HttpError::Status { status, error, .. } => format!("{} {}", status.as_u16(), error.code),
            HttpError::Setup { detail } => detail.clone(),
        }
    }
}

/// `code: field: message`, then one line per further problem. The daemon's messages for a spec
/// start with the field already; it is not said twice.
pub fn api_error_text(error: &ApiError) -> String {
    let mut text = error.code.clone();
    if let Some(field) = error.field.as_deref().filter(|field| !field.is_empty())
        && !error.message.starts_with(&format!("{field}: "))
    {
        text.push_str(": ");
        text.push_str(field);
    }
    text.push_str(": ");
    text.push_str(&error.message);
    for problem in &error.more {
        text.push_str("\n  ");
        if !problem.field.is_empty() && !problem.message.starts_with(&format!("{}: ", problem.field)) {
            text.push_str(&problem.field);
            text.push_str(": ");
        }
        text.push_str(&problem.message);
    }
    text
}

/// The error chain of a reqwest error below its "error sending request for url" top line, which
/// says nothing the URL next to it does not.
pub(crate) fn reqwest_detail(error: &reqwest::Error) -> String {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    if causes.is_empty() { error.to_string() } else { causes.join(": ") }
}

/// `bad_gateway` for 502: an error code for answers without the daemon's error body.
pub(crate) fn status_code_name(status: StatusCode) -> String {
    status.canonical_reason().map_or_else(
        || format!("http_{}", status.as_u16()),
        |reason| reason.to_lowercase().replace([' ', '-'], "_"),
    )
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::job::FieldProblem;

    use super::*;

    #[test]
    fn api_errors_read_like_the_spec_they_refuse() {
        let error = |field: Option<&str>, message: &str, more: Vec<FieldProblem>| ApiError {
            code: "invalid_spec".to_owned(),
            message: message.to_owned(),
            field: field.map(str::to_owned),
            more,
        };
        let text =
            api_error_text(&error(Some("rollout.top_p"), "expected a number in (0, 1], got 2", vec![]));
        assert_eq!(text, "invalid_spec: rollout.top_p: expected a number in (0, 1], got 2");
        // The daemon's spec messages name their field already.
        let text = api_error_text(&error(Some("rollout.top_p"), "rollout.top_p: expected a number", vec![]));
        assert_eq!(text, "invalid_spec: rollout.top_p: expected a number");
        let more = vec![FieldProblem {
            field: "budget.max_steps".to_owned(),
            message: "must be at least 1".to_owned(),
        }];
        let text = api_error_text(&error(None, "not a spec", more));
        assert_eq!(text, "invalid_spec: not a spec\n  budget.max_steps: must be at least 1");
    }

    fn status(status: u16) -> HttpError {
        HttpError::Status {
            status: StatusCode::from_u16(status).unwrap(),
            error: Box::new(ApiError {
                code: "x".to_owned(),
                message: "y".to_owned(),
                field: None,
                more: Vec::new(),
            }),
            from_daemon: true,
            hint: None,
            retry_after: None,
        }
    }

    #[test]
    fn exit_statuses_follow_the_kind_of_failure() {
        assert_eq!(status(422).exit(), Exit::Refused);
        assert_eq!(status(409).exit(), Exit::Refused);
        assert_eq!(status(503).exit(), Exit::Unreachable);
        let unreachable = HttpError::Unreachable { url: String::new(), detail: String::new() };
        assert_eq!(unreachable.exit(), Exit::Unreachable);
        let bad = HttpError::BadAnswer { url: String::new(), detail: String::new() };
        assert_eq!(bad.exit(), Exit::Unreachable);
        let request = HttpError::Request { url: String::new(), detail: String::new() };
        assert_eq!(request.exit(), Exit::Refused);
        assert_eq!(HttpError::Setup { detail: String::new() }.exit(), Exit::Ended);
        assert_eq!([Exit::Done, Exit::Ended, Exit::Refused, Exit::Unreachable].map(Exit::code), [0, 1, 2, 3]);
        assert!(status(429).is_transient() && status(502).is_transient() && !status(404).is_transient());
        assert!(!request.is_transient());
        let refused = HttpError::Unreachable {
            url: "http://h/".to_owned(),
            detail: "client error (Connect): tcp connect error: Connection refused (os error 111)".to_owned(),
        };
        assert_eq!([refused.short(), status(503).short()], ["Connection refused (os error 111)", "503 x"]);
    }

    #[test]
    fn a_401_says_where_the_token_came_from() {
        let HttpError::Status { error, .. } = status(401) else { unreachable!() };
        let error = HttpError::Status {
            status: StatusCode::UNAUTHORIZED,
            error,
            from_daemon: true,
            hint: Some("the token came from RLVR_TOKEN".to_owned()),
            retry_after: None,
        };
        assert_eq!(error.to_string(), "x: y\n  (the token came from RLVR_TOKEN)");
        assert_eq!(status_code_name(StatusCode::BAD_GATEWAY), "bad_gateway");
        assert_eq!(status_code_name(StatusCode::from_u16(599).unwrap()), "http_599");
    }
}
