//! What one grammar may cost, at compile time and per token, and how choices are
//! compiled so that they stay cheap.
//!
//! - Compile: llguidance's compile cannot be interrupted (its cancellation covers
//!   only a built parser's operations), so the sources are capped before any work
//!   ([`check_size`]: [`MAX_CHOICES`] options, [`MAX_SOURCE_BYTES`] of regex, Lark,
//!   JSON schema or choice text), and llguidance's own [`parser_limits`] bound what
//!   a small source can expand into. Under the caps the dearest compiles measured
//!   on the default model take about 0.2 s of CPU (the `grammar` unit tests hold
//!   them under 1 s).
//! - Choices: compiled as one regex alternation ([`choice_regex`]): a single
//!   lexeme, where a Lark alternation of N strings puts N items in each Earley row
//!   and, past llguidance's 2000 per row, fails after its first token.
//! - Per token: a [`Budget`] of time spent in llguidance, refilled by
//!   [`STEP_BUDGET`] per token up to [`BUDGET_RESERVE`]. Ambiguous grammars cost
//!   more with every token (Earley rows grow with the output); once one has spent
//!   its reserve, its request fails, before it stalls the engine's other requests.
//!   It is charged what the engine asks per token: masks, the advance, and the
//!   sampler's single-token questions (at most 256) up to [`CHARGED_CHECKS`].
//!   The budget reads the wall clock (some 30 ns) until a charge would spend it
//!   out; the wall clock also counts time the thread sat descheduled on a busy
//!   machine, so the grammar is not failed then but charged the thread's CPU time
//!   from there on (some 0.6 us a reading here), with a fresh reserve. A grammar
//!   that really does the work fails once that reserve is spent too.

use super::error::GrammarError;
use super::GrammarSpec;
use llguidance::api::ParserLimits;
use std::time::{Duration, Instant};

/// The most options a choice may list.
pub const MAX_CHOICES: usize = 10_000;
/// The most bytes of source a grammar may have: a regex, a Lark grammar, a JSON
/// schema as compact JSON text, or a choice's options together.
pub const MAX_SOURCE_BYTES: usize = 128 * 1024;
/// The time in llguidance each generated token adds to a grammar's budget: some ten
/// times a JSON schema's whole-vocabulary mask on the default model (0.3-0.4 ms),
/// and a victim stream's gap grows by at most about this while such a grammar runs.
pub const STEP_BUDGET: Duration = Duration::from_millis(5);
/// The most unspent time a grammar keeps (it starts with it): slow tokens draw on it
/// without failing.
pub const BUDGET_RESERVE: Duration = Duration::from_millis(50);

/// The single-token questions per token charged to the budget: four times the
/// sampler's most (256). A caller checking the whole vocabulary against the mask,
/// as the tests do, is not charged for the rest.
pub const CHARGED_CHECKS: usize = 1024;

/// llguidance's limits for folio's grammars: its defaults (a mask is bounded by
/// `step_max_items`, 50,000 Earley items, about 2.5 ms, and `step_lexer_fuel`;
/// a compile by `initial_lexer_fuel`, about 20 ms, and `max_grammar_size`), with
/// short errors (no parser state or grammar text in them).
pub(crate) fn parser_limits() -> ParserLimits {
    ParserLimits {
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// Refuses a source over the caps, before any compile work.
pub(crate) fn check_size(spec: &GrammarSpec) -> Result<(), GrammarError> {
    let too_large = |what, size, limit| GrammarError::TooLarge { what, size, limit };
    let bytes = match spec {
        GrammarSpec::JsonObject => 0,
        GrammarSpec::JsonSchema(s) => s.to_string().len(),
        GrammarSpec::Regex(r) => r.len(),
        GrammarSpec::Lark(g) => g.len(),
        GrammarSpec::Choice(c) => {
            if c.len() > MAX_CHOICES {
                return Err(too_large("the number of choices", c.len(), MAX_CHOICES));
            }
            c.iter().map(String::len).sum()
        }
    };
    if bytes > MAX_SOURCE_BYTES {
        return Err(too_large("its source, in bytes,", bytes, MAX_SOURCE_BYTES));
    }
    Ok(())
}

/// A regex matching exactly one of `choices` (each taken literally).
pub(crate) fn choice_regex(choices: &[String]) -> String {
    let mut re = String::with_capacity(choices.iter().map(|c| c.len() + 1).sum::<usize>() + 4);
    re.push_str("(?:");
    for (i, c) in choices.iter().enumerate() {
        if i > 0 {
            re.push('|');
        }
        escape_into(c, &mut re);
    }
    re.push(')');
    re
}

/// `s` as a regex matching it literally: its regex metacharacters escaped.
fn escape_into(s: &str, out: &mut String) {
    for ch in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
}

/// Time a grammar may still spend in llguidance: [`BUDGET_RESERVE`] at first,
/// [`STEP_BUDGET`] more per token, never more than the reserve; on the wall clock
/// until that is spent out, then on the thread's CPU time (the module docs say why).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    left: Duration,
    cpu_time: bool,
}

/// Where a charged call started, on the clock its budget read then.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mark {
    Wall(Instant),
    Cpu(Duration),
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            left: BUDGET_RESERVE,
            cpu_time: false,
        }
    }
}

impl Budget {
    /// The start of a call to charge with [`Budget::charge`], on the same thread.
    pub fn mark(&self) -> Mark {
        match self.cpu_time {
            false => Mark::Wall(Instant::now()),
            true => Mark::Cpu(thread_cpu_time()),
        }
    }

    /// Takes the time since `mark`; false when it was more than what was left.
    pub fn charge(&mut self, mark: Mark) -> bool {
        self.spend(match mark {
            Mark::Wall(start) => start.elapsed(),
            Mark::Cpu(start) => thread_cpu_time().saturating_sub(start),
        })
    }

    /// Takes `spent`; false when it was more than what was left (nothing is left
    /// then). The first time the wall clock's `spent` is more, the budget moves to
    /// CPU time with a full reserve instead.
    fn spend(&mut self, spent: Duration) -> bool {
        match self.left.checked_sub(spent) {
            Some(left) => {
                self.left = left;
                true
            }
            None if !self.cpu_time => {
                self.cpu_time = true;
                self.left = BUDGET_RESERVE;
                true
            }
            None => {
                self.left = Duration::ZERO;
                false
            }
        }
    }

    /// One more token: [`STEP_BUDGET`] more, up to the reserve.
    pub fn refill(&mut self) {
        self.left = (self.left + STEP_BUDGET).min(BUDGET_RESERVE);
    }
}

/// The CPU time the calling thread has run.
#[cfg(unix)]
pub(crate) fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Without a thread clock, the wall clock since the first reading.
#[cfg(not(unix))]
pub(crate) fn thread_cpu_time() -> Duration {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_over_the_caps_are_refused_before_compiling() {
        let many: Vec<String> = (0..=MAX_CHOICES).map(|i| i.to_string()).collect();
        assert!(matches!(
            check_size(&GrammarSpec::Choice(many)),
            Err(GrammarError::TooLarge {
                limit: MAX_CHOICES,
                ..
            })
        ));
        let long = vec!["x".repeat(MAX_SOURCE_BYTES + 1)];
        assert!(check_size(&GrammarSpec::Choice(long)).is_err());
        let big = "a".repeat(MAX_SOURCE_BYTES + 1);
        for spec in [
            GrammarSpec::Regex(big.clone()),
            GrammarSpec::Lark(big.clone()),
            GrammarSpec::JsonSchema(serde_json::json!({"enum": [big]})),
        ] {
            let e = check_size(&spec).unwrap_err();
            assert!(e.to_string().contains("too large"), "{e}");
        }
        let fits = "a".repeat(MAX_SOURCE_BYTES);
        check_size(&GrammarSpec::Regex(fits)).unwrap();
        check_size(&GrammarSpec::JsonObject).unwrap();
    }

    #[test]
    fn a_choice_regex_takes_each_option_literally() {
        let re = choice_regex(&["a.b".into(), "(x|y)*".into(), "".into(), "é#~".into()]);
        assert_eq!(re, r"(?:a\.b|\(x\|y\)\*||é\#\~)");
        let full = regex_automata::meta::Regex::new(&format!("^{re}$")).unwrap();
        for yes in ["a.b", "(x|y)*", "", "é#~"] {
            assert!(full.is_match(yes), "{yes:?}");
        }
        for no in ["axb", "x", "xy", "é"] {
            assert!(!full.is_match(no), "{no:?}");
        }
    }

    #[test]
    fn the_budget_refills_per_token_up_to_its_reserve_and_moves_to_cpu_time_once() {
        let mut b = Budget::default();
        assert!(b.spend(BUDGET_RESERVE - Duration::from_millis(1)));
        b.refill();
        assert!(b.spend(STEP_BUDGET));
        for _ in 0..1000 {
            b.refill();
        }
        // Past the reserve on the wall clock: CPU time from here on, a full reserve.
        assert!(!b.cpu_time);
        assert!(b.spend(BUDGET_RESERVE + Duration::from_nanos(1)));
        assert!(b.cpu_time);
        assert!(matches!(b.mark(), Mark::Cpu(_)));
        assert!(b.spend(BUDGET_RESERVE));
        // Spent out on CPU time: the grammar fails, and nothing is left until the
        // next token.
        assert!(!b.spend(Duration::from_nanos(1)));
        assert!(!b.spend(Duration::from_nanos(1)));
        b.refill();
        assert!(b.spend(STEP_BUDGET));
        assert!(!b.spend(BUDGET_RESERVE + Duration::from_nanos(1)));
    }

    #[test]
    fn sleeping_costs_no_cpu_time_and_working_does() {
        let mut b = Budget {
            left: BUDGET_RESERVE,
            cpu_time: true,
        };
        let mark = b.mark();
        std::thread::sleep(BUDGET_RESERVE * 2);
        assert!(b.charge(mark));
        // Work until the thread's own clock says twice the reserve (however long the
        // wall clock takes on a busy machine).
        let mark = b.mark();
        let start = thread_cpu_time();
        while thread_cpu_time() - start < BUDGET_RESERVE * 2 {
            std::hint::black_box(start);
        }
        assert!(!b.charge(mark));
    }
}
