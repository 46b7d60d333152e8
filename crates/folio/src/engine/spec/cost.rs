//! What one more row costs a step, measured on this machine while the engine runs.
//!
//! A draft pays when the tokens it is expected to yield beat the rows it adds, so the
//! drafter must know what a row costs against a one-row step. That depends on the
//! CPU, its kernel path, the model and the threads: on AMD Zen 4's AVX-512 path a row
//! of the default model cost 0.12-0.17 of a one-row step, on Zen 3's AVX2 path with
//! the four-row Q4_1 kernels about 0.3, on an Intel Xeon's AVX-512 path 0.25-0.36
//! (verifying a row also samples it). So the engine fits it from its own steps: for
//! every step of one sequence's decode row and draft (every row taking logits), the
//! step's time against its rows, by least squares over recent steps with older
//! steps' weights decaying. Steps of several sequences are left out: their rows'
//! contexts differ, and a batch that shrinks as its sequences end while their
//! contexts grow made the slope look near zero. Until the steps have varied enough in
//! rows to tell a slope (a sequence that never drafted), the cost is the prior,
//! [`ROW_COST`].

/// A drafted row's cost in decode steps of one row, before any is measured: the
/// default model on AMD Zen 4, AVX-512, 2 threads (docs/BENCHMARKS.md, "Speculative
/// decoding"): a decode step of b rows took 3.60, 4.22, 4.92, 6.80 and 11.5 ms at
/// b = 1, 2, 4, 8, 16, 0.12-0.17 of a one-row step per added row.
pub const ROW_COST: f32 = 0.15;

/// The weight a step keeps per later step (a memory of about 100 steps).
const DECAY: f64 = 0.99;
/// The least weighted variance of the steps' rows that tells a slope.
const MIN_VARIANCE: f64 = 0.2;
/// The least (weighted) steps before the fit is believed.
const MIN_STEPS: f64 = 16.0;
/// The bounds of a believed cost: a fit outside them is noise (a step slowed by
/// something else), and above the upper one no draft could pay anyway.
const BOUNDS: (f32, f32) = (0.05, 0.6);

/// The decayed sums of a least-squares fit of step time against rows.
#[derive(Debug, Clone, Default)]
pub struct RowCost {
    n: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl RowCost {
    /// A step of `rows` rows, every one taking logits, took `secs` seconds.
    pub fn observe(&mut self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let x = rows as f64;
        for s in [
            &mut self.n,
            &mut self.x,
            &mut self.y,
            &mut self.xx,
            &mut self.xy,
        ] {
            *s *= DECAY;
        }
        self.n += 1.0;
        self.x += x;
        self.y += secs;
        self.xx += x * x;
        self.xy += x * secs;
    }

    /// An added row's cost in one-row steps: the fitted slope over the fitted time of
    /// one row, within [`BOUNDS`]; [`ROW_COST`] until the steps tell.
    pub fn estimate(&self) -> f32 {
        if self.n < MIN_STEPS {
            return ROW_COST;
        }
        let (mx, my) = (self.x / self.n, self.y / self.n);
        let var = self.xx / self.n - mx * mx;
        if var < MIN_VARIANCE {
            return ROW_COST;
        }
        let slope = (self.xy / self.n - mx * my) / var;
        let one = my + slope * (1.0 - mx);
        if one <= 0.0 || !slope.is_finite() {
            return ROW_COST;
        }
        ((slope / one) as f32).clamp(BOUNDS.0, BOUNDS.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prior_until_rows_vary_then_the_fitted_cost() {
        let mut c = RowCost::default();
        for _ in 0..200 {
            c.observe(1, 0.004);
        }
        assert_eq!(c.estimate(), ROW_COST, "one-row steps tell no slope");
        // A one-row step of 4 ms, 1.2 ms a row more.
        for i in 0..200 {
            let rows = 1 + i % 9;
            c.observe(rows, 0.004 + 0.0012 * (rows - 1) as f64);
        }
        let e = c.estimate();
        assert!((e - 0.3).abs() < 0.01, "{e}");
        // The machine changes: rows become cheap, and the fit follows.
        for i in 0..1000 {
            let rows = 1 + i % 9;
            c.observe(rows, 0.004 + 0.0004 * (rows - 1) as f64);
        }
        let e = c.estimate();
        assert!((e - 0.1).abs() < 0.01, "{e}");
    }

    #[test]
    fn a_wild_fit_stays_within_bounds() {
        let mut c = RowCost::default();
        for i in 0..100 {
            // More rows, less time: noise, not a negative cost.
            let rows = 1 + i % 4;
            c.observe(rows, 0.01 / rows as f64);
        }
        assert_eq!(c.estimate(), BOUNDS.0);
        let mut c = RowCost::default();
        for i in 0..100 {
            let rows = 1 + i % 4;
            c.observe(rows, 0.001 + 0.01 * (rows - 1) as f64);
        }
        assert_eq!(c.estimate(), BOUNDS.1);
        c.observe(0, 1.0);
        c.observe(3, f64::NAN);
        assert_eq!(
            c.estimate(),
            BOUNDS.1,
            "nothing from empty or unmeasured steps"
        );
    }
}
