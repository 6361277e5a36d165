//! The extension's modules form layers, listed bottom to top in
//! docs/ARCHITECTURE.md ("Layers"): a module may use only the modules
//! listed before it. This reads every `crate::` path in extension/src and
//! fails on one that points up or sideways (which is how import cycles
//! start), or on a module the list does not name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The modules in layer order, from the ```text block under "## Layers":
/// each line names modules (then, after two spaces, what they are).
fn layer_order() -> Vec<String> {
    let doc = std::fs::read_to_string(workspace().join("docs/ARCHITECTURE.md")).unwrap();
    let section = doc.split("\n## Layers").nth(1).expect("docs/ARCHITECTURE.md has a Layers section");
    let block = section.split("```text\n").nth(1).and_then(|b| b.split("```").next()).expect("a ```text block");
    block
        .lines()
        .flat_map(|line| {
            line.split("  ").next().unwrap_or("").split_whitespace().map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

/// The top-level module a file belongs to (`None` for lib.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next()?.as_os_str().to_string_lossy().into_owned();
    (first != "lib.rs").then(|| first.trim_end_matches(".rs").to_string())
}

/// The top-level modules a source text names after `crate::`, including
/// grouped imports (`crate::{a, b::c}`).
fn uses(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            found.extend(inner.split(',').map(|p| p.trim().split("::").next().unwrap_or("").to_string()));
        } else {
            found.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    found.retain(|name| !name.is_empty() && name != "self");
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let order = layer_order();
    let rank: HashMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
    let src = workspace().join("extension/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else { continue };
        let Some(&own) = rank.get(module.as_str()) else {
            wrong.push(format!("{}: module `{module}` is not in the Layers list", file.display()));
            continue;
        };
        for used in uses(&std::fs::read_to_string(file).unwrap()) {
            match rank.get(used.as_str()) {
                Some(&theirs) if theirs <= own => {}
                Some(_) => {
                    wrong.push(format!("{}: `{module}` uses `{used}`, which is listed after it", file.display()))
                }
                None => {
                    wrong.push(format!("{}: `{module}` uses `{used}`, which is not in the Layers list", file.display()))
                }
            }
        }
    }
    assert!(wrong.is_empty(), "layer order (docs/ARCHITECTURE.md, Layers) broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_grouped_and_nested_paths() {
    assert_eq!(
        uses("use crate::{catalog, jobs::NewJob};\nlet x = crate::gucs::timeout();"),
        ["catalog", "jobs", "gucs"]
    );
}
