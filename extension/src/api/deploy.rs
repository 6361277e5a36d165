//! `lambdastore.deploy`: validate, describe, register.

use crate::access::{self, Caller};
use crate::catalog::{grants, modules};
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::host::registry;
use crate::model::Description;
use crate::runtime;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Who may deploy is checked first, then the size, then whether these are
/// the bytes already running; only then is the module compiled (which
/// cannot be interrupted) and asked to describe itself, and its compiled
/// artifact is cached only once the version is registered.
pub(crate) fn deploy(caller: Caller, app: &str, wasm: &[u8]) -> Result<Value> {
    check_app_name(app)?;
    let owner = grants::create_and_lock(app, caller.0)?;
    if !caller.acts_as(owner) {
        return Err(LambdaError::PermissionDenied(format!(
            "application \"{app}\" belongs to role \"{}\"",
            access::role_name(owner)
        )));
    }
    let limit = gucs::max_module_bytes();
    if wasm.len() > limit {
        return Err(LambdaError::TooLarge {
            what: "the module is",
            size: wasm.len(),
            limit,
            setting: "lambdastore.max_module_size",
        });
    }
    let sha256 = hex::encode(Sha256::digest(wasm));
    if let Some(running) = modules::running(app, &sha256)? {
        return Ok(summary(app, &sha256, &running, &modules::get(running.module_id)?.description));
    }
    let (description, compiled) = registry::validate(caller, wasm)?;
    let deployed = modules::deploy(app, &sha256, wasm, &description, caller.0)?;
    runtime::cache_compiled(&sha256, &compiled, modules::shas_in_use()?);
    Ok(summary(app, &sha256, &deployed, &description))
}

fn summary(app: &str, sha256: &str, deployed: &modules::Deployed, description: &Description) -> Value {
    json!({
        "app": app,
        "version": deployed.version,
        "module_id": deployed.module_id,
        "sha256": sha256,
        "unchanged": deployed.unchanged,
        "sdk": description.sdk,
        "types": description.types,
    })
}

/// 42602 unless `name` is 1-63 letters, digits, '_', '.' or '-', starting
/// with a letter or '_'.
pub(crate) fn check_app_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !valid {
        return Err(LambdaError::InvalidName(format!(
            "application name \"{name}\" must be 1-63 letters, digits, '_', '.' or '-', starting with a letter or '_'"
        )));
    }
    Ok(())
}
