//! `lambdastore.deploy`: validate, describe, register.

use crate::access::{self, Caller};
use crate::catalog::{grants, modules};
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::host::registry;
use crate::runtime;
use lambdastore_core::model::Description;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Who may deploy is checked first (`claim`), then the size, then whether these are
/// the bytes already running; only then is the module compiled (which
/// cannot be interrupted) and asked to describe itself, and its compiled
/// artifact is cached only once the version is registered.
pub(crate) fn deploy(caller: Caller, app: &str, wasm: &[u8]) -> Result<Value> {
    claim(caller, app)?;
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
        return Ok(summary(app, &sha256, &running, &modules::get(running.module_id)?.description, &[]));
    }
    let (description, compiled) = registry::validate(caller, &sha256, wasm)?;
    refuse_older_fields(app, &description)?;
    let types = description.types.iter().map(|t| t.name.clone()).collect();
    let dropped = modules::types_dropped_in_use(app, types)?;
    for (ty, objects) in &dropped {
        // Allowed (the entries stay, and a later version with the type
        // serves them again), but rarely meant: said as a warning, and in
        // the summary for a deploy over HTTP, whose client sees no warning.
        pgrx::warning!(
            "this version of application \"{app}\" has no type \"{ty}\": its {objects} object(s) cannot be \
             called until a version has it again (lambdastore.delete_object deletes them)"
        );
    }
    let deployed = modules::deploy(app, &sha256, wasm, &description, caller.0)?;
    runtime::cache_compiled(&sha256, &compiled, modules::shas_in_use()?);
    Ok(summary(app, &sha256, &deployed, &description, &dropped))
}

/// Refuses a version whose types read their fields as at version 1 (no
/// migration) while objects of them were migrated further by a later
/// version (55000): rolled back so, a call read those fields as empty and
/// wrote beside them, and the migrated version, deployed again, never saw
/// what it wrote. A type with a migration refuses newer fields itself, at
/// the call (the SDKs).
fn refuse_older_fields(app: &str, description: &Description) -> Result<()> {
    let unmigrated = description
        .types
        .iter()
        .filter(|t| !t.functions.iter().any(|f| f.name == crate::host::calls::MIGRATE))
        .map(|t| t.name.clone())
        .collect();
    let behind = modules::types_behind_their_objects(app, unmigrated)?;
    if behind.is_empty() {
        return Ok(());
    }
    let which: Vec<String> =
        behind.iter().map(|(ty, objects)| format!("{objects} object(s) of type \"{ty}\"")).collect();
    Err(LambdaError::NewerFields(format!(
        "{} of application \"{app}\" have fields a later version migrated, which this version, without a migration \
         for the type, would read as empty: deploy a version that has the type's migration",
        which.join(", ")
    )))
}

/// The one check of a right to deploy, wherever a deploy comes from (SQL,
/// or the gateway for the role that created the request's API key), and
/// for creating an application (a first deploy, or `create_api_key`):
/// the role holds EXECUTE on `lambdastore.deploy(text, bytea)`, which a
/// superuser may revoke from PUBLIC and grant to the roles that may, and
/// it owns `app`, or `app` does not exist yet and is created, owned by it.
/// The application's row stays locked to the end of the transaction.
pub(crate) fn claim(caller: Caller, app: &str) -> Result<()> {
    check_app_name(app)?;
    if !grants::may_deploy(caller.0)? {
        return Err(LambdaError::PermissionDenied(format!(
            "role \"{}\" may not deploy: it has no EXECUTE privilege on lambdastore.deploy(text, bytea)",
            caller.name()
        )));
    }
    let owner = grants::create_and_lock(app, caller.0)?;
    if !caller.acts_as(owner) {
        return Err(LambdaError::PermissionDenied(format!(
            "application \"{app}\" belongs to role \"{}\"",
            access::role_name(owner)
        )));
    }
    Ok(())
}

fn summary(
    app: &str,
    sha256: &str,
    deployed: &modules::Deployed,
    description: &Description,
    dropped: &[(String, i64)],
) -> Value {
    let dropped: Vec<Value> = dropped.iter().map(|(ty, objects)| json!({"type": ty, "objects": objects})).collect();
    json!({
        "app": app,
        "version": deployed.version,
        "module_id": deployed.module_id,
        "sha256": sha256,
        "unchanged": deployed.unchanged,
        "sdk": description.sdk,
        "types": description.types,
        "types_dropped": dropped,
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
