//! The library's modules depend one way: every `crate::<module>` path in `src/` points to a
//! module of a lower layer, as `ARCHITECTURE.md`'s table says (the table is read from there).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → rank, from the table of `ARCHITECTURE.md`.
fn ranks() -> BTreeMap<String, u32> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("read ARCHITECTURE.md");
    let mut ranks = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(rank), Some(modules)) = (cells.get(2), cells.get(3)) else {
            continue;
        };
        let Ok(rank) = rank.parse::<u32>() else {
            continue;
        };
        for module in modules.split(',') {
            let module = module.trim().trim_matches('`');
            ranks.insert(module.to_owned(), rank);
        }
    }
    ranks
}

/// Every `.rs` file under `dir`, with the top-level module it belongs to.
fn sources(dir: &Path, top: Option<&str>, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        if path.is_dir() {
            sources(&path, Some(top.unwrap_or(&stem)), out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let module = top.unwrap_or(&stem).to_owned();
            out.push((module, std::fs::read_to_string(&path).expect("read file")));
        }
    }
}

/// The lowercase names after `crate::` in `text` (module paths; items re-exported at the crate
/// root, such as `crate::LockClient`, start with a capital).
fn mentions(text: &str) -> BTreeSet<String> {
    text.split("crate::")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[test]
fn every_import_points_down_the_layers() {
    let ranks = ranks();
    assert!(
        ranks.len() >= 10,
        "the table of ARCHITECTURE.md was not read: {ranks:?}"
    );
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        None,
        &mut files,
    );
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    for (module, text) in &files {
        if module == "lib" {
            continue;
        }
        let Some(&rank) = ranks.get(module) else {
            panic!("module `{module}` is in no layer of ARCHITECTURE.md");
        };
        for dep in mentions(text) {
            if dep == *module || !ranks.contains_key(&dep) {
                continue;
            }
            if module == "layer" {
                upward.push(format!(
                    "{module} uses crate::{dep}: the tower layers use the public API only"
                ));
                continue;
            }
            let dep_rank = ranks[&dep];
            if dep_rank > rank || (dep_rank == rank && rank > 0) {
                upward.push(format!(
                    "{module} (rank {rank}) uses {dep} (rank {dep_rank})"
                ));
            }
            edges.entry(module.clone()).or_default().insert(dep);
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layers:\n{}",
        upward.join("\n")
    );
    // Modules of rank 0 may use each other, but not in a circle.
    fn reaches(
        edges: &BTreeMap<String, BTreeSet<String>>,
        from: &str,
        to: &str,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        edges.get(from).is_some_and(|deps| {
            deps.iter()
                .any(|d| d == to || (seen.insert(d.clone()) && reaches(edges, d, to, seen)))
        })
    }
    for module in edges.keys() {
        assert!(
            !reaches(&edges, module, module, &mut BTreeSet::new()),
            "`{module}` imports itself through others"
        );
    }
}

#[test]
fn the_check_reads_paths_as_the_compiler_does() {
    let text = "use crate::acquire::{Ask, Engine};\n/// see [`x`](crate::LockClient::inspect)\ncrate::time::after(a, b)";
    let found: Vec<String> = mentions(text).into_iter().collect();
    assert_eq!(found, ["acquire", "time"]);
}
