//! Measures whether work a client controls stalls the engine thread: a victim's
//! greedy stream is timed token by token alone, then again while attackers loop, and
//! its longest gap between two tokens must stay under about twice the longest alone
//! (with a floor, as the machine is shared: a stall the rule forbids is seconds long).

use crate::client::open_stream;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Gaps between the tokens of one stream.
#[derive(Debug, Clone, Copy)]
pub struct Gaps {
    pub median: Duration,
    pub longest: Duration,
    /// Token events received.
    pub tokens: usize,
}

/// A greedy stream of `tokens` tokens; the gaps between its token events (the first
/// token's wait is the queue's, not a gap).
pub fn stream_gaps(addr: SocketAddr, tokens: usize) -> Gaps {
    let body = json!({"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let mut s = open_stream(addr, "/v1/completions", &body);
    assert_eq!(s.status, 200);
    let mut at = Vec::new();
    while let Some(e) = s.next_event() {
        if e == "[DONE]" {
            break;
        }
        at.push(Instant::now());
    }
    let mut gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.len() >= tokens / 2,
        "{} events for {tokens} tokens",
        at.len()
    );
    gaps.sort();
    Gaps {
        median: gaps[gaps.len() / 2],
        longest: *gaps.last().expect("gaps"),
        tokens: at.len(),
    }
}

/// The victim's gaps alone, then while `attack(i)` loops on `threads` threads (each
/// call one attacking request; `i` counts the calls of that thread).
pub fn under_attack(
    addr: SocketAddr,
    tokens: usize,
    threads: usize,
    attack: impl Fn(usize, usize) + Sync,
) -> (Gaps, Gaps) {
    let _ = stream_gaps(addr, 8); // warm
    let alone = stream_gaps(addr, tokens);
    let stop = AtomicBool::new(false);
    let attacked = std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, attack) = (&stop, &attack);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    attack(t, i);
                    i += 1;
                }
            });
        }
        // Let the attack get going before the victim starts.
        std::thread::sleep(Duration::from_millis(300));
        let g = stream_gaps(addr, tokens);
        stop.store(true, Ordering::Relaxed);
        g
    });
    (alone, attacked)
}

/// The rule: under attack, the longest gap stays under twice the longest alone, or
/// 150 ms, whichever is more.
pub fn assert_no_stall(what: &str, alone: Gaps, attacked: Gaps) {
    assert_no_stall_but(what, alone, attacked, Duration::ZERO);
}

/// [`assert_no_stall`] for attacks the engine lets take `allowed` of a step by design
/// (a grammar's time budget), on top of the rule's limit.
pub fn assert_no_stall_but(what: &str, alone: Gaps, attacked: Gaps, allowed: Duration) {
    let limit = (alone.longest * 2).max(Duration::from_millis(150)) + allowed;
    eprintln!(
        "{what}: median gap {:?} alone, {:?} under attack; longest {:?} alone, {:?} under attack (limit {limit:?})",
        alone.median, attacked.median, alone.longest, attacked.longest
    );
    assert!(
        attacked.longest <= limit,
        "{what} stalled the engine: longest gap {:?} against {:?} alone (limit {limit:?})",
        attacked.longest,
        alone.longest
    );
}
