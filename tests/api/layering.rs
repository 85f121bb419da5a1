//! The dependency rule, read from the sources' `crate::` paths: model ← store, core ← adapters
//! (http, grpc, ui, metrics); the middleware imports no adapter; the model imports nothing of the
//! crate; no two top-level modules import each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The protocol and presentation adapters.
const ADAPTERS: [&str; 4] = ["http", "grpc", "ui", "metrics"];

/// The top-level module of a source file (`src/core/job.rs` → `core`), `None` for binaries.
fn module_of(path: &Path, src: &Path) -> Option<String> {
    let relative = path.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "bin" | "main" | "lib")).then(|| name.to_string())
}

/// The top-level modules a source names through `crate::`, comments left out.
fn imports(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// Every top-level module with the modules it imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut pending = vec![src.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && let Some(module) = module_of(&path, &src)
            {
                let source = std::fs::read_to_string(&path).expect("read source");
                let uses = graph.entry(module.clone()).or_default();
                uses.extend(imports(&source).into_iter().filter(|m| *m != module));
            }
        }
    }
    graph
}

#[test]
fn the_core_and_the_middleware_import_no_adapter() {
    let graph = graph();
    for module in ["core", "store", "middleware", "contract", "maintenance"] {
        let uses = graph.get(module).cloned().unwrap_or_default();
        let adapters: Vec<&String> = uses
            .iter()
            .filter(|m| ADAPTERS.contains(&m.as_str()))
            .collect();
        assert!(adapters.is_empty(), "{module} imports {adapters:?}");
    }
}

#[test]
fn the_model_and_the_store_stand_below_the_core() {
    let graph = graph();
    let model = graph.get("model").cloned().unwrap_or_default();
    assert!(model.is_empty(), "model imports {model:?}");
    let store = graph.get("store").cloned().unwrap_or_default();
    assert!(!store.contains("core"), "store imports core: {store:?}");
}

#[test]
fn no_two_modules_import_each_other() {
    let graph = graph();
    let mut cycles = Vec::new();
    for (a, uses) in &graph {
        for b in uses {
            if a < b && graph.get(b).is_some_and(|back| back.contains(a)) {
                cycles.push((a.clone(), b.clone()));
            }
        }
    }
    assert_eq!(cycles, [], "mutual imports between top-level modules");
}

#[test]
fn the_reader_sees_paths_and_skips_comments() {
    let found = imports(
        "use crate::core::{Job, Service};\n// crate::http is named here only\nlet x = crate::store::Store::new(); /* */",
    );
    assert_eq!(
        found,
        BTreeSet::from(["core".to_string(), "store".to_string()])
    );
}
