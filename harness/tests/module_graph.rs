//! No import cycle in either crate: among the children of every module (the crate root's top-level modules,
//! `quant`'s `q4_k`, `q8`, …), the "uses" graph with subtrees collapsed is acyclic.
//!
//! An edge a → b means a file inside child `a` names a path inside sibling `b` (`use crate::b::…`,
//! `super::b::…`, an inline `crate::b::f(…)`); a path through a `pub use` re-export counts as a path to where
//! the item is defined, so `crate::NumericsMode` re-exported at the root is an edge to the module defining it.
//! A parent naming its children and a child naming its parent's own items are not edges (that is how a
//! directory module is built). `#[cfg(test)]` modules are left out: tests may reach across.
//!
//! This is the small check issue 24 asked for in place of `cargo-modules` (which would add a long build to a
//! fresh machine's CI). It reads source text, so it knows Rust paths only as far as this lexer does: comments,
//! strings and char literals are skipped, `use` groups (`crate::{a, b::{c, d}}`) are expanded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

/// One source file: its module path and the paths it names (already absolute, without `crate`).
struct File {
    module: ModPath,
    /// Paths as written (`crate::a::b`, `super::c`, `child::d`).
    paths: Vec<ModPath>,
    /// `pub use` re-exports defined in this module: exported name → path as written.
    reexports: Vec<(String, ModPath)>,
    /// Child modules declared `#[cfg(test)] mod name;`.
    test_children: Vec<String>,
}

fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_string());
    }
    parts
}

/// Tokens of Rust source without comments and literals: identifiers, `::`, `{`, `}`, `,`, `;`, `*`, `#`,
/// `[`, `]`, `(`, `)` and other single characters.
fn tokens(text: &str) -> Vec<String> {
    let b: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && (b.get(i + 1) == Some(&'#') || b.get(i + 1) == Some(&'"')) {
            // raw string r#"…"#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push("r".into());
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // a char literal ('a', '\n', '\u{..}') or a lifetime ('a)
            if b.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let s = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(b[s..i].iter().collect());
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Drops `#[cfg(test)] mod name { … }` from a token stream; the names of `#[cfg(test)] mod name;` (test
/// modules in their own file) are pushed to `test_files`.
fn without_test_modules(t: Vec<String>, test_files: &mut Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < t.len() {
        let is_cfg_test = t[i] == "#"
            && t.get(i + 1).map(String::as_str) == Some("[")
            && t.get(i + 2).map(String::as_str) == Some("cfg")
            && t.get(i + 3).map(String::as_str) == Some("(")
            && t.get(i + 4).map(String::as_str) == Some("test")
            && t.get(i + 5).map(String::as_str) == Some(")")
            && t.get(i + 6).map(String::as_str) == Some("]");
        if is_cfg_test {
            let mut j = i + 7;
            if t.get(j).map(String::as_str) == Some("pub") {
                j += 1;
            }
            if t.get(j).map(String::as_str) == Some("mod") {
                // skip to the matching close brace (or the `;` of `mod tests;`)
                while j < t.len() && t[j] != "{" && t[j] != ";" {
                    j += 1;
                }
                if t.get(j).map(String::as_str) == Some(";") {
                    test_files.push(t[j - 1].clone());
                }
                if t.get(j).map(String::as_str) == Some("{") {
                    let mut depth = 0;
                    while j < t.len() {
                        if t[j] == "{" {
                            depth += 1;
                        } else if t[j] == "}" {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        j += 1;
                    }
                }
                i = j + 1;
                continue;
            }
        }
        out.push(t[i].clone());
        i += 1;
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Parses a use tree starting at `t[i]` (after `prefix::`), pushing every leaf path; returns the index after it.
fn use_tree(t: &[String], mut i: usize, prefix: &ModPath, leaves: &mut Vec<ModPath>) -> usize {
    let mut path = prefix.clone();
    loop {
        match t.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                loop {
                    match t.get(i).map(String::as_str) {
                        Some("}") => return i + 1,
                        Some(",") => i += 1,
                        None => return i,
                        _ => i = use_tree(t, i, &path, leaves),
                    }
                }
            }
            Some("*") => {
                leaves.push(path);
                return i + 1;
            }
            Some(s) if is_ident(s) => {
                if s != "self" {
                    path.push(s.to_string());
                }
                i += 1;
                if t.get(i).map(String::as_str) == Some("::") {
                    i += 1;
                    continue;
                }
                if t.get(i).map(String::as_str) == Some("as") {
                    i += 2;
                }
                leaves.push(path);
                return i;
            }
            _ => {
                leaves.push(path);
                return i;
            }
        }
    }
}

/// Makes a path absolute (segments after `crate`) from a file in `module`; `None` for other crates' paths
/// and for names that are not a child module (a prelude type, a local item).
fn absolute(modules: &BTreeSet<ModPath>, module: &ModPath, rel: &[String]) -> Option<ModPath> {
    let first = rel.first()?;
    let mut child = module.clone();
    child.push(first.clone());
    if modules.contains(&child) {
        let mut abs = module.clone();
        abs.extend(rel.iter().cloned());
        return Some(abs);
    }
    if first == "crate" {
        return Some(rel[1..].to_vec());
    }
    if first == "super" || first == "self" {
        let mut base = module.clone();
        let mut k = 0;
        while rel.get(k).map(String::as_str) == Some("super") {
            base.pop();
            k += 1;
        }
        if rel.get(k).map(String::as_str) == Some("self") {
            k += 1;
        }
        base.extend(rel[k..].iter().cloned());
        return Some(base);
    }
    None
}

fn parse_file(src: &Path, file: &Path) -> File {
    let module = module_of(src, file);
    let text = std::fs::read_to_string(file).unwrap();
    let mut test_children = Vec::new();
    let t = without_test_modules(tokens(&text), &mut test_children);
    let mut paths = Vec::new();
    let mut reexports = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i] == "use" {
            let public = i > 0 && (t[i - 1] == "pub" || t[i - 1] == ")");
            let mut leaves = Vec::new();
            let end = use_tree(&t, i + 1, &Vec::new(), &mut leaves);
            for leaf in leaves {
                if public {
                    if let Some(name) = leaf.last() {
                        reexports.push((name.clone(), leaf.clone()));
                    }
                }
                paths.push(leaf);
            }
            i = end.max(i + 1);
            continue;
        }
        let starts_path = (t[i] == "crate" || t[i] == "super")
            && t.get(i + 1).map(String::as_str) == Some("::")
            && (i == 0 || t[i - 1] != "::");
        if starts_path && !(i > 0 && t[i - 1] == "(" && i > 1 && t[i - 2] == "pub") {
            let mut rel = vec![t[i].clone()];
            let mut j = i + 1;
            while t.get(j).map(String::as_str) == Some("::")
                && t.get(j + 1).is_some_and(|s| is_ident(s))
            {
                rel.push(t[j + 1].clone());
                j += 2;
            }
            paths.push(rel);
            i = j;
            continue;
        }
        i += 1;
    }
    File {
        module,
        paths,
        reexports,
        test_children,
    }
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module a path lands in, following re-exports (`pub use`) to where the item is defined.
fn resolve(
    modules: &BTreeSet<ModPath>,
    reexports: &BTreeMap<(ModPath, String), ModPath>,
    path: &ModPath,
    depth: usize,
) -> ModPath {
    let mut m = 0;
    for k in 0..=path.len() {
        if modules.contains(&path[..k].to_vec()) {
            m = k;
        }
    }
    let module = path[..m].to_vec();
    if depth < 8 {
        if let Some(name) = path.get(m) {
            if let Some(target) = reexports.get(&(module.clone(), name.clone())) {
                if target != path {
                    let mut t = target.clone();
                    t.extend(path[m + 1..].iter().cloned());
                    return resolve(modules, reexports, &t, depth + 1);
                }
            }
        }
    }
    module
}

/// Every cycle among siblings, as `parent: a -> b -> … -> a` lines (one per strongly connected component).
fn cycles(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    files.sort();
    let mut parsed: Vec<File> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs") || !src.join("lib.rs").exists())
        .map(|f| parse_file(src, f))
        .collect();
    // files that are test modules (`#[cfg(test)] mod tests;`) and everything below them
    let test_modules: Vec<ModPath> = parsed
        .iter()
        .flat_map(|f| {
            f.test_children.iter().map(|c| {
                let mut m = f.module.clone();
                m.push(c.clone());
                m
            })
        })
        .collect();
    parsed.retain(|f| !test_modules.iter().any(|t| f.module.starts_with(t)));
    let modules: BTreeSet<ModPath> = parsed.iter().map(|f| f.module.clone()).collect();
    let mut reexports = BTreeMap::new();
    for f in &parsed {
        for (name, target) in &f.reexports {
            if let Some(abs) = absolute(&modules, &f.module, target) {
                reexports.insert((f.module.clone(), name.clone()), abs);
            }
        }
    }
    // edges among the children of each parent: parent → (child a → child b)
    let mut edges: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for f in &parsed {
        for p in f
            .paths
            .iter()
            .filter_map(|p| absolute(&modules, &f.module, p))
        {
            let target = resolve(&modules, &reexports, &p, 0);
            // the longest common prefix is the parent; both sides must go below it
            let common = f
                .module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common < f.module.len() && common < target.len() {
                edges
                    .entry(f.module[..common].to_vec())
                    .or_default()
                    .entry(f.module[common].clone())
                    .or_default()
                    .insert(target[common].clone());
            }
        }
    }
    let mut found = Vec::new();
    for (parent, graph) in &edges {
        for comp in strongly_connected(graph) {
            let name = if parent.is_empty() {
                "crate".to_string()
            } else {
                parent.join("::")
            };
            let detail: Vec<String> = comp
                .iter()
                .map(|a| {
                    let outs: Vec<&String> = graph
                        .get(a)
                        .map(|s| s.iter().filter(|b| comp.contains(*b)).collect())
                        .unwrap_or_default();
                    format!("{a} -> {outs:?}")
                })
                .collect();
            found.push(format!("in {name}: {}", detail.join("; ")));
        }
    }
    found
}

/// Tarjan-free SCCs for small graphs: two nodes share a component when each reaches the other.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for m in graph.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let nodes: BTreeSet<String> = graph
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a.clone()).chain(bs.iter().cloned()))
        .collect();
    let reaches: BTreeMap<String, BTreeSet<String>> =
        nodes.iter().map(|n| (n.clone(), reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut comps = Vec::new();
    for n in &nodes {
        if done.contains(n) || !reaches[n].contains(n) {
            continue;
        }
        let comp: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reaches[n].contains(*m) && reaches[*m].contains(n))
            .cloned()
            .collect();
        done.extend(comp.iter().cloned());
        comps.push(comp);
    }
    comps
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

#[test]
fn the_engine_has_no_import_cycle() {
    let found = cycles(&crate_src("engine"));
    assert!(
        found.is_empty(),
        "import cycles in engine/src:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_harness_has_no_import_cycle() {
    let found = cycles(&crate_src("harness"));
    assert!(
        found.is_empty(),
        "import cycles in harness/src:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_a_cycle_through_a_reexport_and_ignores_tests() {
    let dir = std::env::temp_dir().join(format!("lockstep-modgraph-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("quant")).unwrap();
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).unwrap();
    write(
        "lib.rs",
        "pub mod ops; pub mod quant; pub mod leaf;\npub use quant::Mode;\n",
    );
    write(
        "leaf.rs",
        "// use crate::ops; in a comment\nconst S: &str = \"crate::ops::x\";\nuse crate::quant::Mode;\n",
    );
    write("ops.rs", "use crate::Mode;\npub fn f() {}\n");
    write(
        "quant/mod.rs",
        "mod q8;\npub enum Mode {}\n#[cfg(test)]\nmod tests { use crate::leaf; }\n#[cfg(test)]\nmod more;\n",
    );
    write("quant/more.rs", "use crate::leaf::x;\n");
    write(
        "quant/q8.rs",
        "pub fn g() { crate::ops::f(); super::Mode::x(); }\n",
    );
    let found = cycles(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("in crate:"), "{found:?}");
    assert!(found[0].contains("ops -> [\"quant\"]"), "{found:?}");
    assert!(found[0].contains("quant -> [\"ops\"]"), "{found:?}");
    // the commented, quoted and test-only paths made no edge into `leaf`
    assert!(!found[0].contains("leaf"), "{found:?}");
    // break the cycle: q8 no longer calls into ops
    write("quant/q8.rs", "pub fn g() { super::Mode::x(); }\n");
    assert!(cycles(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
