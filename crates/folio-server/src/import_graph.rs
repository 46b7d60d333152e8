//! Tests: the server's modules import each other one way, never in a circle. A
//! file's edges are the modules its `crate::<module>` paths name (plain `use` lines,
//! grouped `use crate::{a, b::C}` ones and paths inline; comment lines aside, test
//! modules included). `lib.rs` is the root that declares every module: no module
//! names an item of it (it only wires), so it is never part of a circle.

use std::collections::BTreeMap;
use std::path::Path;

/// Module → the modules it imports.
type Graph = BTreeMap<String, Vec<String>>;

/// The text of `src`'s files by module (a file in a folder belongs to the folder's
/// module), comment lines left out.
fn sources(src: &Path) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut stack = vec![(src.to_path_buf(), None::<String>)];
    while let Some((dir, module)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                stack.push((p, Some(module.clone().unwrap_or(stem))));
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let code: String = text
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .map(|l| format!("{l}\n"))
                    .collect();
                out.entry(module.clone().unwrap_or(stem))
                    .or_default()
                    .push_str(&code);
            }
        }
    }
    out
}

/// The first names of the paths after each `crate::` in `code`: `crate::a::B` gives
/// `a`, `crate::{a::B, c}` gives `a` and `c`.
fn named(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // Split the group at its top-level commas.
        let (mut depth, mut start) = (0usize, 0usize);
        for (j, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.push(ident(&group[start..j]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(ident(&group[start..j]));
                    start = j + 1;
                }
                _ => {}
            }
        }
    }
    out.retain(|n| !n.is_empty() && n != "self");
    out
}

/// The module graph of `sources` without `lib`, and the names that are no module
/// (`file: name`: an item of lib.rs named from a module).
fn graph(sources: &BTreeMap<String, String>) -> (Graph, Vec<String>) {
    let mut g = Graph::new();
    let mut not_modules = Vec::new();
    for (m, code) in sources.iter().filter(|(m, _)| *m != "lib") {
        let mut to: Vec<String> = Vec::new();
        for n in named(code) {
            if !sources.contains_key(&n) || n == "lib" {
                not_modules.push(format!("{m}: crate::{n}"));
            } else if n != *m && !to.contains(&n) {
                to.push(n);
            }
        }
        g.insert(m.clone(), to);
    }
    (g, not_modules)
}

/// A circle of `g` (its modules in import order, the first repeated at the end), if
/// there is one.
fn circle(g: &Graph) -> Option<Vec<String>> {
    // Depth-first; `path` is the chain being walked, `done` the modules left behind.
    fn walk(
        g: &Graph,
        m: &str,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut c = path[at..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.iter().any(|d| d == m) {
            return None;
        }
        path.push(m.to_string());
        for next in g.get(m).into_iter().flatten() {
            if let Some(c) = walk(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.push(m.to_string());
        None
    }
    let mut done = Vec::new();
    g.keys()
        .find_map(|m| walk(g, m, &mut Vec::new(), &mut done))
}

/// The server's sources, but for this file (its examples are no imports).
fn server_sources() -> BTreeMap<String, String> {
    let mut s = sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(s
        .remove(module_path!().rsplit("::").next().unwrap())
        .is_some());
    s
}

#[test]
fn the_modules_import_each_other_without_a_circle() {
    let (g, _) = graph(&server_sources());
    assert!(g.len() > 10, "the source files were not found: {g:?}");
    if let Some(c) = circle(&g) {
        panic!("modules import each other in a circle: {}", c.join(" -> "));
    }
}

#[test]
fn no_module_imports_from_lib_rs() {
    let (_, not_modules) = graph(&server_sources());
    assert!(
        not_modules.is_empty(),
        "lib.rs is the wiring; these name an item of it instead of the module that owns it: {not_modules:?}"
    );
}

#[test]
fn the_check_finds_a_circle_and_reads_every_path_form() {
    let src = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(m, c)| (m.to_string(), c.to_string()))
            .collect()
    };
    let s = src(&[
        ("lib", "mod a; mod b; mod c; pub struct Config;"),
        ("a", "use crate::b::X;\nfn f() { crate::c::g(); }"),
        ("b", "use crate::{\n    c::{Y, Z},\n    lib_item,\n};"),
        ("c", "use my_crate::a;\n"),
    ]);
    assert_eq!(named(&s["b"]), ["c", "lib_item"]);
    let (g, not_modules) = graph(&s);
    assert_eq!(g["a"], ["b", "c"]);
    assert_eq!(not_modules, ["b: crate::lib_item"]);
    assert_eq!(circle(&g), None);
    let s = src(&[
        ("lib", ""),
        ("a", "use crate::b;"),
        ("b", "use crate::c::Z;"),
        ("c", "pub fn z() { crate::a::f() }"),
    ]);
    assert_eq!(circle(&graph(&s).0).unwrap(), ["a", "b", "c", "a"]);
}
