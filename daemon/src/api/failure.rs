//! A refused request, as every route answers it: a status, `{"error": {"code", "message",
//! "field", "more"}}` and, for a refusal that passes, `Retry-After`. The errors of the layers
//! below (the job store, the submit use case) become one here; the token check's are `auth`'s.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rlvr_protocol::job::{ApiError, ErrorBody, FieldProblem};
use rlvr_protocol::spec::SpecError;
use rlvr_queue::store::StoreError;

use crate::jobs::submit::{Refusal, SubmitError};

/// A refused request.
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    error: ApiError,
    retry_after_s: Option<u64>,
}

impl Failure {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Failure {
            status,
            error: ApiError { code: code.to_owned(), message: message.into(), field: None, more: Vec::new() },
            retry_after_s: None,
        }
    }

    pub(crate) fn field(mut self, field: &str) -> Self {
        if !field.is_empty() {
            self.error.field = Some(field.to_owned());
        }
        self
    }

    /// A refused spec: the first problem in front, every one in `more`.
    pub(crate) fn spec(status: StatusCode, code: &str, mut problems: Vec<SpecError>) -> Self {
        let first = problems.remove(0);
        let mut failure = Failure::new(status, code, first.to_string()).field(&first.field);
        failure.error.more =
            problems.into_iter().map(|p| FieldProblem { field: p.field, message: p.message }).collect();
        failure
    }

    /// The server's own files failed (`store` says which: "the dataset store", "the registry"):
    /// 507 when its disk is full or read-only — the operator's to fix, and worth a retry once
    /// fixed — and 500 otherwise. The cause, with its path where it has one, goes to the log; the
    /// answer names no server path.
    pub(crate) fn storage(store: &str, error: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        tracing::error!(%error, "{store}");
        let (code, message) = match error.kind() {
            ErrorKind::StorageFull => ("storage_full", format!("{store}'s disk is full on the server")),
            ErrorKind::ReadOnlyFilesystem => {
                ("storage_read_only", format!("{store}'s disk is read-only on the server"))
            }
            _ => {
                return Failure::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("{store} failed; retry later"),
                );
            }
        };
        Failure::new(
            StatusCode::INSUFFICIENT_STORAGE,
            code,
            format!("{message}; retry once its operator has fixed it"),
        )
        .retry(60)
    }

    pub(crate) fn not_found(id: &str) -> Self {
        Failure::new(StatusCode::NOT_FOUND, "not_found", format!("no job {id} visible to this token"))
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound(id) => Failure::not_found(&id),
            StoreError::Conflict { .. } => Failure::new(StatusCode::CONFLICT, "conflict", error.to_string()),
            StoreError::Redis(_) => Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "redis_unavailable",
                format!("the job store does not answer ({error}); retry shortly"),
            )
            .retry(2),
            StoreError::Corrupt { .. } => {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "corrupt_record", error.to_string())
            }
        }
    }
}

impl Failure {
    pub(crate) fn retry(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }
}

impl From<SubmitError> for Failure {
    fn from(error: SubmitError) -> Self {
        match error {
            SubmitError::Refused(Refusal { problems, forbidden }) => {
                let status = if forbidden { StatusCode::FORBIDDEN } else { StatusCode::UNPROCESSABLE_ENTITY };
                Failure::spec(status, "cannot_run", problems)
            }
            SubmitError::QueueFull { .. } => {
                Failure::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", error.to_string()).retry(30)
            }
            SubmitError::Store(error) => error.into(),
            SubmitError::Internal(message) => {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(ErrorBody { error: self.error })).into_response();
        if let Some(seconds) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

pub(crate) type Answer<T> = Result<T, Failure>;
