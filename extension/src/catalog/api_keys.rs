//! API keys (`lambdastore.api_keys`): an application's credentials at the
//! HTTP gateway. Only a SHA-256 of each key is kept.

use super::{cache, query, query_cluster};
use crate::error::{LambdaError, Result};
use pgrx::pg_sys::{self, BuiltinOid::*};
use sha2::{Digest, Sha256};

/// Creates a key for `app`; returns its id and the key, which is shown
/// only this once. 256 random bits, so a fast hash is enough to store.
pub(crate) fn create(app: &str, label: Option<&str>, created_by: pg_sys::Oid) -> Result<(i64, String)> {
    super::grants::stored_roles_are_ours()?;
    let mut random = [0u8; 32];
    if !crate::pg::backend::strong_random(&mut random) {
        return Err(LambdaError::Internal("could not generate a random API key".into()));
    }
    let key = format!("lsk_{}", hex::encode(random));
    let id = super::unique_id(c"lambdastore.api_keys_key_id_seq")?;
    let id = query_cluster(
        "INSERT INTO lambdastore.api_keys (key_id, app, label, sha256, prefix, created_by)
         VALUES ($5, $1, $2, sha256(convert_to($3, 'UTF8')), left($3, 12), $4) RETURNING key_id",
        &[TEXTOID, TEXTOID, TEXTOID, OIDOID, INT8OID],
        &[app.into(), label.into(), key.as_str().into(), created_by.into(), id.into()],
        |rows| rows.first().get_one::<i64>(),
    )?
    .ok_or_else(|| LambdaError::Internal("API key insert returned nothing".into()))?;
    Ok((id, key))
}

/// The application of key `key_id`, if there is such a key.
pub(crate) fn app_of(key_id: i64) -> Result<Option<String>> {
    query("SELECT app FROM lambdastore.api_keys WHERE key_id = $1", &[INT8OID], &[key_id.into()], |rows| {
        Ok(rows.into_iter().next().map(|row| row.get::<String>(1)).transpose()?.flatten())
    })
}

/// The application of `key` if it is a valid, unrevoked key; from the
/// backend's cache when it was seen before (catalog/cache.rs).
pub(crate) fn app_of_key(key: &str) -> Result<Option<String>> {
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    if let Some(app) = cache::api_key(&digest) {
        return Ok(Some(app));
    }
    let app = query(
        "SELECT app FROM lambdastore.api_keys WHERE sha256 = $1 AND revoked IS NULL",
        &[BYTEAOID],
        &[digest.as_slice().into()],
        |rows| Ok(rows.into_iter().next().map(|row| row.get::<String>(1)).transpose()?.flatten()),
    )?;
    if let Some(app) = &app {
        cache::remember_api_key(digest, app);
    }
    Ok(app)
}

/// The application of `key` and the role that created it, if it is a
/// valid, unrevoked key: a deploy through the gateway is that role's.
pub(crate) fn app_and_creator_of_key(key: &str) -> Result<Option<(String, pg_sys::Oid)>> {
    super::grants::stored_roles_are_ours()?; // the creator is stored by OID
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    query(
        "SELECT app, created_by FROM lambdastore.api_keys WHERE sha256 = $1 AND revoked IS NULL",
        &[BYTEAOID],
        &[digest.as_slice().into()],
        |rows| {
            rows.into_iter()
                .next()
                .map(|row| {
                    Ok((row.get::<String>(1)?.unwrap_or_default(), row.get::<pg_sys::Oid>(2)?.unwrap_or_default()))
                })
                .transpose()
        },
    )
}

/// Revokes the key now; false if it was revoked already. Every backend
/// forgets the keys it has seen once this commits.
pub(crate) fn revoke(key_id: i64) -> Result<bool> {
    // Also when the key was revoked already: by a bare UPDATE, say, which
    // no backend hears of, and this is how to make them hear of it.
    cache::changed();
    query_cluster(
        "UPDATE lambdastore.api_keys SET revoked = now() WHERE key_id = $1 AND revoked IS NULL RETURNING 1",
        &[INT8OID],
        &[key_id.into()],
        |rows| Ok(!rows.is_empty()),
    )
}
