//! The example components that `make lambdas` built import only
//! `lambdastore:lambda/host` (and its types) and export `describe` and
//! `dispatch`.
//!
//! Reads `target/lambdas/` (or `$LAMBDASTORE_LAMBDA_DIR`). When the
//! components are not built, the test says so and passes, so that a plain
//! `cargo test` works on a fresh checkout; set
//! `LAMBDASTORE_REQUIRE_LAMBDAS=1` (as CI does after `make lambdas`) to make
//! their absence a failure.

use std::path::PathBuf;

use wit_component::DecodedWasm;
use wit_parser::WorldItem;

const APPS: &[&str] = &["counter", "bank", "forum", "micro"];

fn lambda_dir() -> PathBuf {
    std::env::var_os("LAMBDASTORE_LAMBDA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/lambdas"))
}

#[test]
fn built_components_import_only_the_host_and_export_describe_and_dispatch() {
    let dir = lambda_dir();
    let required = std::env::var_os("LAMBDASTORE_REQUIRE_LAMBDAS").is_some_and(|v| v == "1");
    for app in APPS {
        let path = dir.join(format!("{app}.wasm"));
        let Ok(bytes) = std::fs::read(&path) else {
            assert!(!required, "{} is missing: run `make lambdas`", path.display());
            eprintln!("skipped {}: not built (run `make lambdas`)", path.display());
            continue;
        };

        // The same check the tool runs before writing a component.
        lambdastore_componentize::check(&bytes).unwrap_or_else(|e| panic!("{app}: {e:#}"));

        // And spelled out: the decoded world's imports and exports.
        let DecodedWasm::Component(resolve, world) = wit_component::decode(&bytes).unwrap() else {
            panic!("{app} is not a component");
        };
        let world = &resolve.worlds[world];
        let mut imports: Vec<String> = world
            .imports
            .iter()
            .filter(|(_, item)| matches!(item, WorldItem::Interface { .. }))
            .map(|(key, _)| resolve.name_world_key(key))
            .collect();
        imports.sort();
        // `later` (timers, delayed spawns) only by an application using it:
        // the others run on servers that lack it.
        imports.retain(|name| !(*app == "micro" && name == "lambdastore:lambda/later@0.1.0"));
        assert!(
            imports == ["lambdastore:lambda/host@0.1.0", "lambdastore:lambda/types@0.1.0"]
                || imports == ["lambdastore:lambda/host@0.1.0"],
            "{app} imports {imports:?}"
        );
        let mut exports: Vec<String> = world.exports.keys().map(|key| resolve.name_world_key(key)).collect();
        exports.sort();
        assert_eq!(exports, ["describe", "dispatch"], "{app}");
    }
}
