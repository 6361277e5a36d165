//! Request extractors whose failures use the gateway's error shape.

use crate::error::ApiError;
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// A header the request may carry once. With two, which one counts would
/// be up to each reader: a proxy in front may check one and the gateway
/// use the other.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a HeaderValue>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(ApiError::bad_request(format!("the request has more than one {name} header")));
    }
    Ok(first)
}

/// The caller's API key, from `Authorization: Bearer <key>`.
pub struct ApiKey(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ApiKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        bearer(&parts.headers)?.map(ApiKey).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing_api_key",
                "send the application's API key as `Authorization: Bearer <key>`",
            )
        })
    }
}

/// The key of `Authorization: Bearer <key>`, if the request has one.
fn bearer(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let value = single(headers, &header::AUTHORIZATION)?.and_then(|v| v.to_str().ok()).unwrap_or("");
    Ok(match value.split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") && !key.trim().is_empty() => {
            Some(key.trim().to_string())
        }
        _ => None,
    })
}

/// The optional `Idempotency-Key` header: 1-255 visible ASCII characters.
pub struct IdempotencyKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let Some(value) = single(&parts.headers, &HeaderName::from_static("idempotency-key"))? else {
            return Ok(IdempotencyKey(None));
        };
        match value.to_str() {
            Ok(key) if (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic()) => {
                Ok(IdempotencyKey(Some(key.to_string())))
            }
            _ => Err(ApiError::bad_request("Idempotency-Key must be 1-255 visible ASCII characters")),
        }
    }
}

/// The optional `lambdastore-min-lsn` header: a WAL position (`0/3000460`,
/// as `lambdastore-commit-lsn` gave it) a standby must have replayed before
/// it answers the call (replicas.rs).
pub struct MinLsn(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for MinLsn {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let Some(value) = single(&parts.headers, &HeaderName::from_static("lambdastore-min-lsn"))? else {
            return Ok(MinLsn(None));
        };
        let half = |h: &str| (1..=8).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit());
        match value.to_str().ok().and_then(|lsn| lsn.split_once('/').map(|(hi, lo)| (lsn, hi, lo))) {
            Some((lsn, hi, lo)) if half(hi) && half(lo) => Ok(MinLsn(Some(lsn.to_string()))),
            _ => Err(ApiError::bad_request("lambdastore-min-lsn must be a WAL position such as 0/3000460")),
        }
    }
}

/// Path parameters; a malformed one (an object id that is not an integer) is 400.
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// Query parameters, 400 when malformed.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryParams(q.0))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "the request body is larger than the gateway accepts",
    )
}

/// The body's media type without its parameters, in lower case: media
/// types are case-insensitive, so `APPLICATION/JSON; charset=utf-8` is JSON.
fn media_type(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = single(headers, &header::CONTENT_TYPE)? else {
        return Ok(None);
    };
    let value = value.to_str().unwrap_or("invalid");
    Ok(Some(value.split(';').next().unwrap_or("").trim().to_ascii_lowercase()))
}

/// The gateway reads bodies as sent: a compressed one would otherwise be
/// taken for malformed JSON or a module that is not a component. A
/// transfer coding other than `chunked` (`gzip, chunked`), which hyper
/// leaves in place, is 501, as RFC 9112 says: a proxy that decodes it would
/// see another body than the gateway.
fn check_not_encoded(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(codings) = codings_other_than(headers, header::TRANSFER_ENCODING, "chunked") {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_implemented",
            format!("the gateway takes no transfer coding but chunked (got {codings:?})"),
        ));
    }
    if let Some(codings) = codings_other_than(headers, header::CONTENT_ENCODING, "identity") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the gateway takes request bodies without a Content-Encoding (got {codings:?}): send it uncompressed"
            ),
        ));
    }
    Ok(())
}

/// The first value of header `name` that lists a coding other than
/// `allowed` (or is not text).
fn codings_other_than(headers: &HeaderMap, name: header::HeaderName, allowed: &str) -> Option<String> {
    headers.get_all(name).iter().map(|value| value.to_str().unwrap_or("invalid")).find_map(|codings| {
        codings.split(',').any(|coding| !coding.trim().eq_ignore_ascii_case(allowed)).then(|| codings.to_string())
    })
}

/// How much of a body is read before its API key is checked. A body up to
/// this size goes to the database with the call, which checks the key
/// there, in the same round trip; past it, the key is checked first, by a
/// round trip of its own: a made-up key with a 16 MiB JSON array cost the
/// server a gigabyte of memory as it parsed the argument, and the gateway
/// one as it read and parsed the body, all before the key was looked at.
const READ_BEFORE_THE_KEY: usize = 64 * 1024;

/// The whole body, if it arrives within `--read-timeout` (a client
/// trickling its body would otherwise keep the connection for as long as
/// it likes) and at most `max_bytes`; past `READ_BEFORE_THE_KEY`, only
/// once the request's API key is known to be valid.
async fn body(request: Request, state: &Arc<AppState>, max_bytes: usize) -> Result<Bytes, ApiError> {
    check_not_encoded(request.headers())?;
    // A body announced larger than the limit is refused before any of it
    // is read (and before an `Expect: 100-continue` is answered).
    let announced = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|length| length > max_bytes as u64) {
        return Err(too_large());
    }
    let key = bearer(request.headers())?.unwrap_or_default();
    let limit = state.config.read_timeout;
    match tokio::time::timeout(limit, read_checking_the_key(request.into_body(), &key, state, max_bytes)).await {
        Ok(bytes) => bytes,
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the request body did not arrive within {}", humantime::format_duration(limit)),
        )),
    }
}

async fn read_checking_the_key(
    mut body: Body,
    key: &str,
    state: &Arc<AppState>,
    max_bytes: usize,
) -> Result<Bytes, ApiError> {
    let mut read = Vec::new();
    let mut key_checked = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("the request body could not be read: {e}")))?;
        let Ok(data) = frame.into_data() else { continue }; // trailers
        if read.len() + data.len() > max_bytes {
            return Err(too_large());
        }
        read.extend_from_slice(&data);
        if !key_checked && read.len() > READ_BEFORE_THE_KEY {
            state.call("check_key", None, "SELECT lambdastore_gateway.check_key($1)", &[&key]).await?;
            key_checked = true;
        }
    }
    Ok(Bytes::from(read))
}

fn unsupported(expected: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!("the request body must be {expected}"),
    )
}

/// A call's JSON arguments; an empty body means `{}`.
pub struct Args(pub serde_json::Value);

impl FromRequest<Arc<AppState>> for Args {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let json = matches!(media_type(request.headers())?.as_deref(), None | Some("application/json"));
        let bytes = body(request, state, state.config.max_body_bytes).await?;
        if bytes.is_empty() {
            return Ok(Args(serde_json::json!({})));
        }
        if !json {
            return Err(unsupported("application/json"));
        }
        serde_json::from_slice(&bytes)
            .map(Args)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    }
}

/// A WebAssembly component, uploaded as `application/wasm` (or `application/octet-stream`).
pub struct Module(pub Bytes);

impl FromRequest<Arc<AppState>> for Module {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        if !matches!(media_type(request.headers())?.as_deref(), Some("application/wasm" | "application/octet-stream")) {
            return Err(unsupported("application/wasm"));
        }
        let bytes = body(request, state, state.config.max_module_bytes).await?;
        if bytes.is_empty() {
            return Err(ApiError::bad_request("the request body is empty: send the component's bytes"));
        }
        Ok(Module(bytes))
    }
}
