//! The extension's modules form layers, listed bottom to top in
//! docs/ARCHITECTURE.md ("Layers"): a module may use only the modules
//! listed before it. This reads every `crate::` and `super::` path in
//! extension/src and fails on one that points up or sideways (which is how
//! import cycles start), or on a module the list does not name. A folder
//! may be listed by its files (`cluster::route`), each at its own level;
//! a path is ranked by the longest listed prefix (`jobs::queue::NewJob` by
//! `jobs::queue`, `jobs::submit` by `jobs`).
//!
//! The files of one folder that share a level (catalog/, host/...) are
//! checked for import circles among themselves: no file may use, through
//! any chain of its siblings, a file that uses it. The folder's mod.rs is
//! left out: it declares the files and holds what they all share, and
//! calls them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
mod common;

use common::source::rust_files;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn src() -> PathBuf {
    workspace().join("extension/src")
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

/// The module path of a file (`catalog/cache.rs`: catalog::cache;
/// `jobs/mod.rs`: jobs; lib.rs: empty).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    if last != "mod.rs" && last != "lib.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The text a file's paths are read from: its `#[cfg(test)]` module left
/// out (its `super::` is the file itself).
fn code(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |at| &text[..at])
}

/// Every path a source text names from the crate's root, in `module` (the
/// file's module path): `crate::a::b`, and `super::b` as its parent's;
/// groups (`crate::{a, b::{c, d}}`) are expanded, globs dropped.
fn uses_in(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    for anchor in ["crate::", "super::"] {
        for (at, _) in text.match_indices(anchor) {
            // A whole word: not `foo_crate::` or `self::super::`.
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
                continue;
            }
            let base: Vec<String> =
                if anchor == "crate::" { Vec::new() } else { module[..module.len().saturating_sub(1)].to_vec() };
            expand(&text[at + anchor.len()..], base, &mut found);
        }
    }
    found
}

/// Reads one path (or group of paths) at the start of `rest`, prefixed by
/// `prefix`, into `out`; returns how much of `rest` it read.
fn expand(rest: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix;
    let mut at = 0;
    loop {
        let tail = &rest[at..];
        if let Some(group) = tail.strip_prefix('{') {
            at += 1;
            let mut inner = 0;
            loop {
                let item = group[inner..].trim_start();
                inner += group[inner..].len() - item.len();
                if item.starts_with('}') || item.is_empty() {
                    return at + inner + 1;
                }
                inner += expand(&group[inner..], path.clone(), out);
                let after = group[inner..].trim_start();
                inner += group[inner..].len() - after.len();
                if after.starts_with(',') {
                    inner += 1;
                }
            }
        }
        let name: String = tail.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        at += name.len();
        match name.as_str() {
            "" if tail.starts_with('*') => return at + 1,
            "" => break,
            "self" => {}
            _ => path.push(name),
        }
        if rest[at..].starts_with("::") {
            at += 2;
        } else {
            break;
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
    at
}

/// The rank of `path`: that of its longest prefix the Layers list names.
fn rank_of(rank: &HashMap<String, usize>, path: &[String]) -> Option<(String, usize)> {
    (1..=path.len()).rev().find_map(|n| {
        let name = path[..n].join("::");
        rank.get(&name).map(|&r| (name, r))
    })
}

fn extension_files() -> Vec<PathBuf> {
    let mut files = rust_files(&src());
    files.sort();
    files
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let order = layer_order();
    let rank: HashMap<String, usize> = order.iter().enumerate().map(|(i, m)| (m.clone(), i)).collect();
    let src = src();
    let mut wrong = Vec::new();
    for file in &extension_files() {
        let module = module_path(&src, file);
        if module.is_empty() {
            continue; // lib.rs
        }
        let uses = uses_in(code(&std::fs::read_to_string(file).unwrap()), &module);
        // A folder's mod.rs that names nothing (it only declares its files)
        // needs no level of its own.
        if uses.is_empty() {
            continue;
        }
        let Some((own_name, own)) = rank_of(&rank, &module) else {
            wrong.push(format!("{}: module `{}` is not in the Layers list", file.display(), module.join("::")));
            continue;
        };
        for used in uses {
            match rank_of(&rank, &used) {
                Some((_, theirs)) if theirs <= own => {}
                Some((name, _)) => {
                    wrong.push(format!("{}: `{own_name}` uses `{name}`, which is listed after it", file.display()))
                }
                None => wrong.push(format!(
                    "{}: `{own_name}` uses `{}`, which is not in the Layers list",
                    file.display(),
                    used.join("::")
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "layer order (docs/ARCHITECTURE.md, Layers) broken:\n{}", wrong.join("\n"));
}

/// The file a path from the crate's root lands in, if any: the longest
/// prefix that is `a/b.rs` or `a/b/mod.rs`.
fn file_of(src: &Path, path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let dir = path[..n].iter().fold(src.to_path_buf(), |d, p| d.join(p));
        let file = dir.with_extension("rs");
        let module = dir.join("mod.rs");
        [file, module].into_iter().find(|f| f.is_file())
    })
}

/// The import graph among the files of each folder, mod.rs left out: file
/// -> the sibling files it names.
fn sibling_graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let src = src();
    let mut graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &extension_files() {
        if file.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs") {
            continue;
        }
        let module = module_path(&src, file);
        let edges = graph.entry(file.clone()).or_default();
        for used in uses_in(code(&std::fs::read_to_string(file).unwrap()), &module) {
            if let Some(target) = file_of(&src, &used) {
                let sibling = target.parent() == file.parent() && target.file_name().is_some_and(|n| n != "mod.rs");
                if sibling && &target != file {
                    edges.insert(target);
                }
            }
        }
    }
    graph
}

/// Every circle in `graph`, each once, as the files along it.
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    fn visit<'a>(
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        node: &'a PathBuf,
        stack: &mut Vec<&'a PathBuf>,
        done: &mut BTreeSet<&'a PathBuf>,
        found: &mut Vec<Vec<PathBuf>>,
    ) {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            found.push(stack[at..].iter().map(|p| (*p).clone()).collect());
            return;
        }
        if done.contains(node) {
            return;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flatten() {
            visit(graph, next, stack, done, found);
        }
        stack.pop();
        done.insert(node);
    }
    let (mut done, mut found) = (BTreeSet::new(), Vec::new());
    for node in graph.keys() {
        visit(graph, node, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

#[test]
fn no_file_imports_a_sibling_that_imports_it() {
    let src = src();
    let found: Vec<String> = circles(&sibling_graph())
        .into_iter()
        .map(|circle| {
            let mut names: Vec<String> =
                circle.iter().map(|f| f.strip_prefix(&src).unwrap().display().to_string()).collect();
            names.push(names[0].clone());
            names.join(" -> ")
        })
        .collect();
    assert!(found.is_empty(), "import circles among the files of a folder:\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_grouped_and_nested_paths() {
    let module = ["host".to_string(), "calls".to_string()];
    let names = |text: &str| -> Vec<String> { uses_in(text, &module).into_iter().map(|p| p.join("::")).collect() };
    assert_eq!(
        names("use crate::{catalog, jobs::NewJob};\nlet x = crate::gucs::timeout();"),
        ["catalog", "jobs::NewJob", "gucs::timeout"]
    );
    assert_eq!(
        names("use crate::cluster::{route::{self, Subtransaction}, layout};"),
        ["cluster::route", "cluster::route::Subtransaction", "cluster::layout"]
    );
    assert_eq!(names("use super::{remote, Frame};\nuse super::*;"), ["host::remote", "host::Frame"]);
}

#[test]
fn the_check_sees_a_circle() {
    let (a, b, c) = (PathBuf::from("a.rs"), PathBuf::from("b.rs"), PathBuf::from("c.rs"));
    let graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> =
        [(a.clone(), [b.clone()].into()), (b.clone(), [c.clone()].into()), (c.clone(), [a.clone()].into())].into();
    assert_eq!(circles(&graph), [vec![a.clone(), b.clone(), c.clone()]]);
    let graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> = [(a.clone(), [b.clone()].into()), (b, [c].into())].into();
    assert!(circles(&graph).is_empty());
}

#[test]
fn every_listed_module_has_a_file() {
    let src = src();
    let stale: Vec<String> = layer_order()
        .into_iter()
        .filter(|name| {
            let dir = name.split("::").fold(src.clone(), |d, p| d.join(p));
            !dir.with_extension("rs").is_file() && !dir.join("mod.rs").is_file()
        })
        .collect();
    assert!(stale.is_empty(), "docs/ARCHITECTURE.md's Layers list names modules extension/src lacks: {stale:?}");
}

/// lambdastore-core is what the gateway and the bench share with the
/// extension without PostgreSQL: its dependencies must stay free of it.
#[test]
fn the_core_crate_needs_no_postgres() {
    let manifest = std::fs::read_to_string(workspace().join("core/Cargo.toml")).unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).expect("core/Cargo.toml has [dependencies]");
    let dependencies = dependencies.split("\n[").next().unwrap_or("");
    let names: Vec<&str> = dependencies
        .lines()
        .filter_map(|line| line.split('=').next().map(str::trim))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(names.contains(&"serde"), "read core's dependencies: {names:?}");
    let postgres: Vec<&&str> = names.iter().filter(|n| n.contains("pg") || n.contains("postgres")).collect();
    assert!(postgres.is_empty(), "lambdastore-core depends on {postgres:?}");
}
