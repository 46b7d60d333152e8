//! Helpers every benchmark file shares: medians of rounds, the list of rounds, and
//! running an optional baseline tool. Bench files import this, never each other.

use anyhow::Result;

/// Each round's figure, rounded, space-separated.
pub fn rounds(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The stdout of an optional baseline tool (`what` names it), or `None` with its stderr
/// printed when it fails: a missing baseline never stops folio's own figures.
pub fn baseline_output(cmd: &mut std::process::Command, what: &str) -> Result<Option<Vec<u8>>> {
    let out = cmd.output()?;
    if !out.status.success() {
        eprintln!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
        return Ok(None);
    }
    Ok(Some(out.stdout))
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}
