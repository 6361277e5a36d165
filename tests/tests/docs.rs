//! The user documentation says what the code does, and keeps saying it:
//! docs/settings.md lists every setting extension/src registers, with its
//! default, unit and who may set it; docs/errors.md lists exactly the
//! SQLSTATEs `LambdaError::sqlstate` raises; README.md stays short; and
//! every relative link in README.md and docs/ reaches a file and heading
//! that exist. Reads files only: no server.

use std::collections::{BTreeMap, BTreeSet, HashMap};
mod common;

use common::source::rust_files;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The one file under extension/src that contains `needle`, wherever the
/// module lives.
fn source_with(needle: &str) -> (PathBuf, String) {
    let files = rust_files(&workspace().join("extension/src"));
    let mut found: Vec<_> =
        files.into_iter().map(|f| (read(&f), f)).filter(|(text, _)| text.contains(needle)).collect();
    assert_eq!(found.len(), 1, "expected one file in extension/src with `{needle}`");
    let (text, file) = found.pop().unwrap();
    (file, text)
}

/// The text from `start` to the end of the item it opens (the first line
/// that closes a brace at `start`'s indentation).
fn item<'a>(text: &'a str, start: &str) -> &'a str {
    let at = text.find(start).unwrap_or_else(|| panic!("`{start}` not found"));
    let indent = text[..at].rsplit('\n').next().unwrap_or("");
    let close = format!("\n{indent}}}\n");
    let end = text[at..].find(&close).map(|e| at + e).unwrap_or(text.len());
    &text[at..end]
}

/// A markdown table: the rows under the header line that starts with
/// `header`, each split into trimmed cells.
fn table(doc: &str, header: &str, file: &str) -> Vec<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(header));
    let columns = lines.next().unwrap_or_else(|| panic!("{file}: no table starting `{header}`")).matches('|').count();
    lines
        .skip(1) // | --- |
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            assert_eq!(l.matches('|').count(), columns, "{file}: a row with another number of columns: {l}");
            l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect()
        })
        .collect()
}

/// The first `code span` of a table cell.
fn first_code(cell: &str) -> Option<&str> {
    cell.split('`').nth(1)
}

// ---------------------------------------------------------------- settings

#[derive(Debug, PartialEq)]
struct Setting {
    default: String,
    unit: &'static str,
    who: &'static str,
}

/// `value` as PostgreSQL's SHOW prints a setting with that base unit: in
/// the largest unit that divides it.
fn display(value: i64, unit: &str) -> String {
    let units: &[(&str, i64)] = match unit {
        "ms" => &[("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000), ("ms", 1)],
        "s" => &[("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1)],
        "kB" => &[("TB", 1 << 30), ("GB", 1 << 20), ("MB", 1 << 10), ("kB", 1)],
        _ => &[("", 1)],
    };
    if value == 0 {
        return "0".into();
    }
    let (name, size) = units.iter().find(|(_, size)| value % size == 0).unwrap();
    format!("{}{name}", value / size)
}

/// The value a `GucSetting::<T>::new(expr)` starts with, as SHOW prints it.
fn default_of(expr: &str, unit: &str, source: &str) -> String {
    let expr = expr.trim();
    if let Some(name) = expr.strip_prefix("Some(c\"").and_then(|e| e.strip_suffix("\")")) {
        return name.to_string();
    }
    if let Some((_, variant)) = expr.rsplit_once("::") {
        // An enum: its `#[name = c"…"]`, on the line before the variant.
        let mut name = None;
        for line in source.lines().map(str::trim) {
            if line == format!("{variant},") {
                return name.unwrap_or_else(|| panic!("enum variant {variant} has no #[name]"));
            }
            name = line.strip_prefix("#[name = c\"").and_then(|l| l.strip_suffix("\"]")).map(str::to_string);
        }
        panic!("enum variant {variant} not found");
    }
    if let Ok(flag) = expr.parse::<bool>() {
        return if flag { "on" } else { "off" }.into();
    }
    if expr.contains('.') {
        return expr.parse::<f64>().unwrap_or_else(|_| panic!("default `{expr}`")).to_string();
    }
    let value = expr.split('*').map(|f| f.trim().replace('_', "").parse::<i64>().expect(expr)).product();
    display(value, unit)
}

/// Every setting `define()` registers: the `c"lambdastore.…"` names in it,
/// each with the static, context and flags that follow it (also when a
/// loop registers several, their context and flags in its body).
fn settings_in_code() -> BTreeMap<String, Setting> {
    let (file, source) = source_with("GucRegistry::define_");
    let define = item(&source, "pub(crate) fn define()");
    let after = |from: usize, prefix: &str| -> String {
        let at = define[from..].find(prefix).map(|a| from + a + prefix.len()).expect(prefix);
        define[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut settings = BTreeMap::new();
    for (at, _) in define.match_indices("c\"lambdastore.") {
        let name: String = define[at + 2..].chars().take_while(|c| *c != '"').collect();
        let setting = after(at, "&");
        let unit = match after(at, "GucFlags::").as_str() {
            "UNIT_MS" => "ms",
            "UNIT_S" => "s",
            "UNIT_KB" => "kB",
            _ => "",
        };
        let who = match after(at, "GucContext::").as_str() {
            "Userset" => "any user",
            "Suset" => "superuser",
            "Sighup" => "reload",
            "Postmaster" => "server start",
            other => panic!("{name}: context {other} has no wording in this test"),
        };
        let declared = format!("static {setting}: GucSetting");
        let statement =
            &source[source.find(&declared).unwrap_or_else(|| panic!("{}: no `{declared}`", file.display()))..];
        let statement = &statement[..statement.find(';').unwrap()];
        let args = &statement[statement.find("::new(").unwrap() + "::new(".len()..statement.rfind(')').unwrap()];
        settings.insert(name, Setting { default: default_of(args, unit, &source), unit, who });
    }
    assert!(settings.len() > 10, "found only {} settings in {}", settings.len(), file.display());
    settings
}

#[test]
fn docs_settings_lists_every_setting_with_its_default() {
    let code = settings_in_code();
    let doc = read(&workspace().join("docs/settings.md"));
    let mut wrong = Vec::new();
    let mut documented = BTreeSet::new();
    for row in table(&doc, "| setting |", "docs/settings.md") {
        let name = first_code(&row[0]).unwrap_or("").to_string();
        let Some(setting) = code.get(&name) else {
            wrong.push(format!("{name}: documented, but extension/src registers no such setting"));
            continue;
        };
        documented.insert(name.clone());
        let default = first_code(&row[1]).unwrap_or("");
        if default != setting.default {
            wrong.push(format!("{name}: default `{default}` in the docs, `{}` in the code", setting.default));
        }
        if row[2] != setting.unit {
            wrong.push(format!("{name}: unit `{}` in the docs, `{}` in the code", row[2], setting.unit));
        }
        if !row[3].starts_with(setting.who) {
            wrong.push(format!("{name}: \"{}\" may set it in the docs, \"{}\" in the code", row[3], setting.who));
        }
    }
    for name in code.keys().filter(|n| !documented.contains(*n)) {
        wrong.push(format!("{name}: registered in extension/src, missing from the table"));
    }
    assert!(wrong.is_empty(), "docs/settings.md and the code disagree:\n{}", wrong.join("\n"));
}

#[test]
fn defaults_read_as_show_prints_them() {
    assert_eq!(display(64 * 1024, "kB"), "64MB");
    assert_eq!(display(64, "kB"), "64kB");
    assert_eq!(display(1000, "ms"), "1s");
    assert_eq!(display(250, "ms"), "250ms");
    assert_eq!(display(0, "ms"), "0");
    assert_eq!(default_of("10_000", "ms", ""), "10s");
    assert_eq!(default_of("Some(c\"postgres\")", "", ""), "postgres");
    assert_eq!(default_of("E::Occ", "", "#[name = c\"occ\"]\n    Occ,"), "occ");
}

// ------------------------------------------------------------------ errors

/// PostgreSQL's SQLSTATE and condition name of each `ERRCODE_` constant the
/// extension uses (src/backend/utils/errcodes.txt). A new one goes here.
const ERRCODES: &[(&str, &str, &str)] = &[
    ("ERRCODE_E_R_E_MODIFYING_SQL_DATA_NOT_PERMITTED", "38002", "modifying_sql_data_not_permitted"),
    ("ERRCODE_EXTERNAL_ROUTINE_EXCEPTION", "38000", "external_routine_exception"),
    ("ERRCODE_FEATURE_NOT_SUPPORTED", "0A000", "feature_not_supported"),
    ("ERRCODE_DUPLICATE_OBJECT", "42710", "duplicate_object"),
    ("ERRCODE_INSUFFICIENT_PRIVILEGE", "42501", "insufficient_privilege"),
    ("ERRCODE_INTERNAL_ERROR", "XX000", "internal_error"),
    ("ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION", "28000", "invalid_authorization_specification"),
    ("ERRCODE_INVALID_FUNCTION_DEFINITION", "42P13", "invalid_function_definition"),
    ("ERRCODE_INVALID_NAME", "42602", "invalid_name"),
    ("ERRCODE_INVALID_PARAMETER_VALUE", "22023", "invalid_parameter_value"),
    ("ERRCODE_NULL_VALUE_NOT_ALLOWED", "22004", "null_value_not_allowed"),
    ("ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE", "55000", "object_not_in_prerequisite_state"),
    ("ERRCODE_OUT_OF_MEMORY", "53200", "out_of_memory"),
    ("ERRCODE_PROGRAM_LIMIT_EXCEEDED", "54000", "program_limit_exceeded"),
    ("ERRCODE_QUERY_CANCELED", "57014", "query_canceled"),
    ("ERRCODE_RAISE_EXCEPTION", "P0001", "raise_exception"),
    ("ERRCODE_READ_ONLY_SQL_TRANSACTION", "25006", "read_only_sql_transaction"),
    ("ERRCODE_STATEMENT_TOO_COMPLEX", "54001", "statement_too_complex"),
    ("ERRCODE_T_R_SERIALIZATION_FAILURE", "40001", "serialization_failure"),
    ("ERRCODE_UNDEFINED_COLUMN", "42703", "undefined_column"),
    ("ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST", "2BP01", "dependent_objects_still_exist"),
    ("ERRCODE_UNDEFINED_FUNCTION", "42883", "undefined_function"),
    ("ERRCODE_UNDEFINED_OBJECT", "42704", "undefined_object"),
    ("ERRCODE_UNIQUE_VIOLATION", "23505", "unique_violation"),
];

/// The SQLSTATEs `LambdaError::sqlstate` maps variants to, with their
/// condition names.
fn sqlstates_in_code() -> BTreeMap<&'static str, &'static str> {
    let (file, source) = source_with("fn sqlstate(&self) -> PgSqlErrorCode");
    let body = item(&source, "pub(crate) fn sqlstate(&self)");
    let known: HashMap<&str, (&str, &str)> = ERRCODES.iter().map(|(k, code, name)| (*k, (*code, *name))).collect();
    let mut codes = BTreeMap::new();
    for (at, _) in body.match_indices("ERRCODE_") {
        let constant: String = body[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let Some(&(code, name)) = known.get(constant.as_str()) else {
            panic!("{}: {constant} is not in this test's ERRCODES: add its SQLSTATE", file.display());
        };
        codes.insert(code, name);
    }
    assert!(codes.len() > 10, "found only {} SQLSTATEs in {}", codes.len(), file.display());
    codes
}

#[test]
fn docs_errors_lists_exactly_the_sqlstates_of_the_code() {
    let code = sqlstates_in_code();
    let doc = read(&workspace().join("docs/errors.md"));
    let mut wrong = Vec::new();
    let mut documented = BTreeSet::new();
    for row in table(&doc, "| failure | SQLSTATE |", "docs/errors.md") {
        let sqlstate = first_code(&row[1]).unwrap_or("");
        match code.get(sqlstate) {
            None => wrong.push(format!("{sqlstate}: documented, but LambdaError::sqlstate never raises it")),
            Some(name) if *name != row[2] => {
                wrong.push(format!("{sqlstate}: condition `{}` in the docs, PostgreSQL calls it `{name}`", row[2]))
            }
            Some(_) => {}
        }
        documented.insert(sqlstate.to_string());
    }
    for (sqlstate, name) in &code {
        if !documented.contains(*sqlstate) {
            wrong.push(format!("{sqlstate} ({name}): raised by LambdaError::sqlstate, missing from the table"));
        }
    }
    assert!(wrong.is_empty(), "docs/errors.md and the code disagree:\n{}", wrong.join("\n"));
}

// ------------------------------------------------------------------- links

#[test]
fn the_readme_stays_short() {
    let lines = read(&workspace().join("README.md")).lines().count();
    assert!(lines <= 300, "README.md has {lines} lines, at most 300: move the details to docs/");
}

/// GitHub's anchor for a heading: lower case, spaces to hyphens, and only
/// letters, digits, hyphens and underscores kept.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A document's lines outside fenced code blocks.
fn prose(doc: &str) -> Vec<&str> {
    let mut fenced = false;
    doc.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchors of a document's headings, repeated ones numbered as GitHub
/// numbers them.
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for line in prose(doc) {
        let Some(heading) = line.strip_prefix('#') else { continue };
        let base = slug(heading.trim_start_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of a document's `[text](target)` links, outside code.
fn links(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(doc) {
        // Code spans are the odd pieces between backticks.
        let text: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
            }
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = workspace();
    let mut documents = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "md") {
            documents.push(entry.path());
        }
    }
    let mut wrong = Vec::new();
    for document in &documents {
        let doc = read(document);
        for link in links(&doc) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() { document.clone() } else { document.parent().unwrap().join(path) };
            let name = document.strip_prefix(&root).unwrap().display().to_string();
            if !target.exists() {
                wrong.push(format!("{name}: ({link}): no such file"));
            } else if !anchor.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&target)).contains(anchor)
            {
                wrong.push(format!("{name}: ({link}): no such heading"));
            }
        }
    }
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

#[test]
fn the_link_check_reads_headings_and_links_as_github_does() {
    assert_eq!(slug(" A call's server memory"), "a-calls-server-memory");
    assert_eq!(slug("Physical backups and standbys (pg_basebackup)"), "physical-backups-and-standbys-pg_basebackup");
    assert_eq!(anchors("# A\n## A\n```\n# not a heading\n```\n"), ["a".to_string(), "a-1".to_string()].into());
    assert_eq!(links("see [x](a.md#b), `[not](c.md)` and ![img](d.png)"), ["a.md#b", "d.png"]);
}
