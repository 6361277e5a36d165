//! `lambdastore.deploy`: validate, describe, register.

use crate::catalog::modules;
use crate::error::{LambdaError, Result};
use crate::runtime;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub fn deploy(app: &str, wasm: &[u8]) -> Result<Value> {
    if !valid_app_name(app) {
        return Err(LambdaError::InvalidName(format!(
            "application name \"{app}\" must be 1-63 letters, digits, '_', '.' or '-', starting with a letter or '_'"
        )));
    }
    let sha256 = hex::encode(Sha256::digest(wasm));
    let description = runtime::validate(&sha256, wasm)?;
    let deployed = modules::deploy(app, &sha256, wasm, &description)?;
    Ok(json!({
        "app": app,
        "version": deployed.version,
        "module_id": deployed.module_id,
        "sha256": sha256,
        "unchanged": deployed.unchanged,
        "sdk": description.sdk,
        "types": description.types,
    }))
}

fn valid_app_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}
