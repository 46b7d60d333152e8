//! The README's library snippets are `examples/library.rs`, line for line, so they
//! compile (clippy builds every example) and run (`cargo run --example library`).

use crate::common::root;

/// The README's ```rust blocks.
fn readme_blocks() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in text.lines() {
        match (&mut cur, line.trim_end()) {
            (None, "```rust") => cur = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(cur.take()),
            (Some(b), l) => b.push(l.to_string()),
            _ => {}
        }
    }
    blocks
}

/// The example's regions between `// README <name>` and `// README end`, unindented.
fn example_regions() -> Vec<Vec<String>> {
    let path = root().join("crates/folio/examples/library.rs");
    let text = std::fs::read_to_string(path).unwrap();
    let mut regions = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in text.lines() {
        let t = line.trim();
        if t == "// README end" {
            regions.extend(cur.take());
        } else if t.starts_with("// README ") {
            cur = Some(Vec::new());
        } else if let Some(r) = &mut cur {
            r.push(
                line.strip_prefix("    ")
                    .unwrap_or(line)
                    .trim_end()
                    .to_string(),
            );
        }
    }
    regions
}

#[test]
fn library_snippets_are_this_example() {
    let (readme, example) = (readme_blocks(), example_regions());
    assert_eq!(readme.len(), 2, "two library snippets in the README");
    assert_eq!(
        readme, example,
        "README.md's rust blocks differ from examples/library.rs"
    );
}
