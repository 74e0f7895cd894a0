//! The per-item work budget: counted units of work, not clock time, so verdicts are deterministic.
//!
//! One unit is roughly one machine-word operation of big-integer arithmetic, or one token or
//! node of parsing. Every loop whose length depends on the input charges the budget before it
//! runs; an exhausted budget ends the item with a timeout verdict, never a hang.

/// Work still allowed for one item.
#[derive(Debug, Clone)]
pub struct Budget {
    left: u64,
    limit: u64,
}

/// The budget ran out; `what` names the work that did not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("work budget exhausted: {what} (limit {limit})")]
pub struct Exhausted {
    /// The item's whole budget.
    pub limit: u64,
    /// The work that did not fit.
    pub what: &'static str,
}

impl Budget {
    /// A budget of `limit` units.
    pub fn new(limit: u64) -> Self {
        Budget { left: limit, limit }
    }

    /// Takes `units` from the budget, or fails naming `what` when they are not left.
    pub fn charge(&mut self, units: u64, what: &'static str) -> Result<(), Exhausted> {
        if units > self.left {
            self.left = 0;
            return Err(Exhausted { limit: self.limit, what });
        }
        self.left -= units;
        Ok(())
    }

    /// Units used so far.
    pub fn used(&self) -> u64 {
        self.limit - self.left
    }

    /// Whether it is spent (a further charge of one unit would fail).
    pub fn is_exhausted(&self) -> bool {
        self.left == 0
    }
}

/// The cost, in units, of multiplying numbers of `a_bits` and `b_bits` bits (schoolbook bound).
pub fn mul_cost(a_bits: u64, b_bits: u64) -> u64 {
    (a_bits / 64 + 1).saturating_mul(b_bits / 64 + 1)
}
