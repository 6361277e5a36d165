//! Turns a lambda application's core module (built for
//! `wasm32-unknown-unknown`, with the component type that `wit-bindgen`
//! embeds) into a component, and checks that the component is one that
//! LambdaStore will load: it imports nothing but `lambdastore:lambda`
//! interfaces and exports exactly `describe` and `dispatch`.
//!
//! The check matters because the host links nothing else: a stray import
//! (say, WASI pulled in by a dependency) would only fail at deploy time,
//! inside PostgreSQL, with a less helpful message.

use anyhow::{bail, Context, Result};
use wit_component::{ComponentEncoder, DecodedWasm};
use wit_parser::{Resolve, WorldItem, WorldKey};

/// The only package a lambda may import from.
const PACKAGE: (&str, &str) = ("lambdastore", "lambda");
/// Its interfaces a lambda may import.
const INTERFACES: &[&str] = &["host", "later", "types"];
/// What a lambda must export, and all it may export.
const EXPORTS: &[&str] = &["describe", "dispatch"];

/// Encodes `core` (a core module with an embedded component type) as a
/// validated component and checks its imports and exports.
pub fn componentize(core: &[u8]) -> Result<Vec<u8>> {
    let component = ComponentEncoder::default()
        .validate(true)
        .module(core)
        .context("the module is not a lambda built with lambdastore-sdk")?
        .encode()
        .context("cannot encode the module as a component")?;
    check(&component)?;
    Ok(component)
}

/// Checks that `component` imports only `lambdastore:lambda/{host,later,types}`
/// and exports exactly `describe` and `dispatch`.
pub fn check(component: &[u8]) -> Result<()> {
    let (resolve, world) = match wit_component::decode(component).context("cannot decode the component's WIT")? {
        DecodedWasm::Component(resolve, world) => (resolve, world),
        DecodedWasm::WitPackage(..) => bail!("this is a WIT package, not a component"),
    };
    let world = &resolve.worlds[world];

    let mut refused = Vec::new();
    for (key, item) in &world.imports {
        match item {
            // Types carry no capability; they come with the interfaces.
            WorldItem::Type(_) => {}
            WorldItem::Interface { id, .. } if is_allowed_interface(&resolve, *id) => {}
            _ => refused.push(resolve.name_world_key(key)),
        }
    }
    if !refused.is_empty() {
        bail!(
            "the component imports {}, but LambdaStore provides only {}:{}/{{{}}}; \
             build for wasm32-unknown-unknown and avoid dependencies that need WASI",
            refused.join(", "),
            PACKAGE.0,
            PACKAGE.1,
            INTERFACES.join(",")
        );
    }

    let exported: Vec<String> = world
        .exports
        .iter()
        .map(|(key, item)| match (key, item) {
            (WorldKey::Name(name), WorldItem::Function(_)) => name.clone(),
            _ => resolve.name_world_key(key),
        })
        .collect();
    if exported.len() != EXPORTS.len() || !EXPORTS.iter().all(|e| exported.iter().any(|x| x == e)) {
        bail!(
            "the component exports [{}], but a lambda exports exactly the functions [{}] \
             (use lambdastore_sdk::app!)",
            exported.join(", "),
            EXPORTS.join(", ")
        );
    }
    Ok(())
}

fn is_allowed_interface(resolve: &Resolve, id: wit_parser::InterfaceId) -> bool {
    let interface = &resolve.interfaces[id];
    let Some(package) = interface.package.map(|p| &resolve.packages[p].name) else {
        return false;
    };
    (package.namespace.as_str(), package.name.as_str()) == PACKAGE
        && interface.name.as_deref().is_some_and(|name| INTERFACES.contains(&name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wit_component::{dummy_module, embed_component_metadata, StringEncoding};
    use wit_parser::ManglingAndAbi;

    const LAMBDA_WIT: &str = include_str!("../../wit/lambda.wit");

    /// A core module like one built with the SDK: the world's imports and
    /// exports (with dummy bodies) and the embedded component type.
    fn core_module(extra_wit: &str, world: &str) -> Vec<u8> {
        let mut resolve = Resolve::default();
        let package = resolve.push_str("lambda.wit", &format!("{LAMBDA_WIT}\n{extra_wit}")).unwrap();
        let world = resolve.select_world(&[package], Some(world)).unwrap();
        let wat = dummy_module(&resolve, world, ManglingAndAbi::Standard32);
        let mut module = wat::parse_bytes(&wat).unwrap().into_owned();
        embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8).unwrap();
        module
    }

    #[test]
    fn accepts_the_lambda_world() {
        let component = componentize(&core_module("", "lambda")).unwrap();
        check(&component).unwrap();
    }

    #[test]
    fn refuses_other_imports() {
        let extra = "interface clock { now: func() -> u64; }
                     world greedy { include lambda; import clock; }";
        let err = componentize(&core_module(extra, "greedy")).unwrap_err();
        assert!(format!("{err:#}").contains("imports lambdastore:lambda/clock"), "{err:#}");
    }

    #[test]
    fn refuses_missing_or_extra_exports() {
        let extra = "world partial { use types.{app-desc}; import host; export describe: func() -> app-desc; }";
        let err = componentize(&core_module(extra, "partial")).unwrap_err();
        assert!(format!("{err:#}").contains("exports [describe]"), "{err:#}");

        let extra = "world chatty { include lambda; export hello: func(); }";
        let err = componentize(&core_module(extra, "chatty")).unwrap_err();
        assert!(format!("{err:#}").contains("hello"), "{err:#}");
    }

    #[test]
    fn refuses_a_module_without_component_type() {
        let module = wat::parse_str("(module)").unwrap();
        assert!(componentize(&module).is_err());
    }
}
