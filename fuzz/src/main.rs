//! `folio-fuzz <target>`: one fuzz target under AFL++ (built by `scripts/fuzz.sh`
//! with `cargo afl build --features afl`). What it needs is loaded before the fork
//! server starts, so each run begins warm.

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(target) = folio_fuzz::target(&name) else {
        let names: Vec<&str> = folio_fuzz::TARGETS.iter().map(|t| t.name).collect();
        eprintln!("usage: folio-fuzz <{}>", names.join("|"));
        std::process::exit(2);
    };
    (target.warm_up)();
    afl::fuzz!(|data: &[u8]| {
        (target.run)(data);
    });
}
