//! One JSON error shape for every failure, and the SQLSTATE → HTTP status
//! table (documented in docs/gateway.md, "Errors").

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Serialize, ToSchema, Debug)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema, Debug)]
pub struct ErrorDetail {
    /// The HTTP status, repeated.
    pub status: u16,
    /// Stable machine-readable code: the PostgreSQL condition name when the
    /// database raised the error, otherwise one of the gateway's own.
    #[schema(example = "undefined_object")]
    pub code: &'static str,
    /// The SQLSTATE, when the database raised the error.
    #[schema(example = "42704")]
    pub sqlstate: Option<String>,
    pub message: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub sqlstate: Option<String>,
    pub message: String,
}

/// Every SQLSTATE a client can cause, with its HTTP status and code.
/// Anything else is a 500 whose details only go to the log.
pub const SQLSTATES: &[(&str, u16, &str)] = &[
    ("28000", 401, "invalid_authorization_specification"),
    ("42501", 403, "insufficient_privilege"),
    ("42704", 404, "undefined_object"),
    ("42883", 404, "undefined_function"),
    ("22023", 400, "invalid_parameter_value"),
    ("22P02", 400, "invalid_text_representation"),
    ("22P05", 400, "untranslatable_character"),
    ("22021", 400, "character_not_in_repertoire"),
    ("42602", 400, "invalid_name"),
    ("23514", 400, "check_violation"),
    ("23505", 409, "unique_violation"),
    ("55000", 409, "object_not_in_prerequisite_state"),
    ("40001", 409, "serialization_failure"),
    ("40P01", 409, "deadlock_detected"),
    ("54000", 413, "program_limit_exceeded"),
    ("P0001", 422, "raise_exception"),
    ("42P13", 422, "invalid_function_definition"),
    ("0A000", 501, "feature_not_supported"),
    ("38000", 502, "external_routine_exception"),
    ("38002", 502, "modifying_sql_data_not_permitted"),
    ("53200", 502, "out_of_memory"),
    ("57014", 504, "query_canceled"),
    ("54001", 508, "statement_too_complex"),
];

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, sqlstate: None, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// 429; the response says when to try again (`Retry-After`).
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", message)
    }

    pub fn timeout(after: std::time::Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!("the request did not finish within {}", humantime::format_duration(after)),
        )
    }

    /// Maps a database error. Errors a client caused keep their message;
    /// the rest are logged with the request's span and reported as 500/503.
    pub fn from_db(err: &tokio_postgres::Error) -> Self {
        let Some(db) = err.as_db_error() else {
            tracing::error!(error = %err, "database connection failed");
            return Self::unavailable("the database is unreachable");
        };
        let sqlstate = db.code().code();
        if let Some(&(_, status, code)) = SQLSTATES.iter().find(|(state, _, _)| *state == sqlstate) {
            return Self {
                status: StatusCode::from_u16(status).expect("valid status"),
                code,
                sqlstate: Some(sqlstate.to_string()),
                message: db.message().to_string(),
            };
        }
        // Class 08 (connection), 57P0x (shutdown, crash recovery) and 53300
        // (too many connections) pass: the client may retry elsewhere or later.
        if sqlstate.starts_with("08") || sqlstate.starts_with("57P") || sqlstate == "53300" {
            tracing::warn!(sqlstate, error = %db, "database unavailable");
            return Self::unavailable("the database is not available; retry later");
        }
        // 25006 here (the `--replica` path answers it itself): the database
        // takes no writes, a standby or a primary demoted by a failover, or
        // the role's default_transaction_read_only.
        if sqlstate == "25006" {
            tracing::warn!(sqlstate, error = %db, "database read-only");
            return Self::unavailable("the database is read-only; retry later");
        }
        tracing::error!(sqlstate, error = %db, detail = ?db.detail(), "unexpected database error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "internal error (logged by the gateway)")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                status: self.status.as_u16(),
                code: self.code,
                sqlstate: self.sqlstate,
                message: self.message,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // The key's requests in flight may well have finished a second later.
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::SQLSTATES;

    #[test]
    fn every_sqlstate_is_listed_once_with_an_error_status() {
        for (i, (state, status, code)) in SQLSTATES.iter().enumerate() {
            assert_eq!(state.len(), 5, "{state}");
            assert!((400..600).contains(status), "{state} -> {status}");
            assert!(!code.is_empty());
            assert!(SQLSTATES[i + 1..].iter().all(|(other, _, _)| other != state), "{state} twice");
        }
    }
}
