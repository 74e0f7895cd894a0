//! Floating-point evaluation of an expression at a point: the fallback for what has no exact
//! form (`\sin x`, `2^{1/3}`, `\ln 2`) and the predicate tests of relations and intervals.
//!
//! Unknown functions (`f(x)`) evaluate to a fixed pseudo-random function of their name and
//! argument, so `f(x)` and `f(y)` differ at random points while `f(2x)` and `f(x+x)` agree.

use std::collections::BTreeMap;

use num_traits::ToPrimitive;

use crate::budget::{Budget, Exhausted};
use crate::lexer::RelOp;
use crate::parse::Expr;

/// Values of free symbols (by their display name).
pub type Env = BTreeMap<String, f64>;

/// The value of `expr` at `env`; NaN when undefined or not a number.
pub fn eval(expr: &Expr, env: &Env, budget: &mut Budget) -> Result<f64, Exhausted> {
    budget.charge(1, "numeric evaluation")?;
    if let Expr::Func(..) = expr {
        if !env.is_empty() {
            if let Some(value) = env.get(&expr.to_string()) {
                return Ok(*value);
            }
        }
    }
    Ok(match expr {
        Expr::Num(n) => n.value.to_f64().unwrap_or(f64::NAN),
        Expr::Sym(name) => env.get(name).copied().unwrap_or(f64::NAN),
        Expr::Pi => std::f64::consts::PI,
        Expr::E => std::f64::consts::E,
        Expr::Infinity => f64::INFINITY,
        Expr::Neg(a) => -eval(a, env, budget)?,
        Expr::Add(items) => {
            let mut sum = 0.0;
            for item in items {
                sum += eval(item, env, budget)?;
            }
            sum
        }
        Expr::Mul(items) => {
            let mut product = 1.0;
            for item in items {
                product *= eval(item, env, budget)?;
            }
            product
        }
        Expr::Div(a, b) | Expr::Ratio(a, b) => {
            let d = eval(b, env, budget)?;
            if d == 0.0 { f64::NAN } else { eval(a, env, budget)? / d }
        }
        Expr::Pow(a, b) => eval(a, env, budget)?.powf(eval(b, env, budget)?),
        Expr::Root(a, n) => {
            let (a, n) = (eval(a, env, budget)?, eval(n, env, budget)?);
            if a < 0.0 && n.fract() == 0.0 && (n as i64) % 2 == 1 {
                -(-a).powf(1.0 / n)
            } else {
                a.powf(1.0 / n)
            }
        }
        Expr::Factorial(a) => {
            let n = eval(a, env, budget)?;
            if n.fract() == 0.0 && (0.0..=170.0).contains(&n) {
                (1..=n as u64).map(|k| k as f64).product()
            } else {
                f64::NAN
            }
        }
        Expr::Abs(a) => eval(a, env, budget)?.abs(),
        Expr::Percent(a) => eval(a, env, budget)? / 100.0,
        Expr::Func(name, args) => {
            let mut values = Vec::with_capacity(args.len());
            for arg in args {
                values.push(eval(arg, env, budget)?);
            }
            function(name, &values)
        }
        _ => f64::NAN,
    })
}

fn function(name: &str, values: &[f64]) -> f64 {
    let x = values.first().copied().unwrap_or(f64::NAN);
    match (name, values.len()) {
        ("sin", 1) => x.sin(),
        ("cos", 1) => x.cos(),
        ("tan", 1) => x.tan(),
        ("sec", 1) => 1.0 / x.cos(),
        ("csc", 1) => 1.0 / x.sin(),
        ("cot", 1) => 1.0 / x.tan(),
        ("arcsin", 1) => x.asin(),
        ("arccos", 1) => x.acos(),
        ("arctan", 1) => x.atan(),
        ("sinh", 1) => x.sinh(),
        ("cosh", 1) => x.cosh(),
        ("tanh", 1) => x.tanh(),
        ("ln", 1) => x.ln(),
        ("log", 1) => x.ln(),
        ("log", 2) => x.ln() / values[1].ln(),
        ("lg", 1) => x.log10(),
        ("exp", 1) => x.exp(),
        ("abs", 1) => x.abs(),
        ("floor", 1) => x.floor(),
        ("ceil", 1) => x.ceil(),
        ("max", _) => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ("min", _) => values.iter().copied().fold(f64::INFINITY, f64::min),
        ("binom", 2) => binom(x, values[1]),
        _ => unknown_function(name, values),
    }
}

fn binom(n: f64, k: f64) -> f64 {
    if k.fract() != 0.0 || n.fract() != 0.0 || !(0.0..=1000.0).contains(&k) {
        return f64::NAN;
    }
    (0..k as u64).fold(1.0, |acc, i| acc * (n - i as f64) / (i as f64 + 1.0))
}

/// A fixed pseudo-random function of the name and the arguments (rounded to 9 significant
/// digits, so arguments computed two ways agree).
fn unknown_function(name: &str, values: &[f64]) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |byte: u8| {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    };
    for byte in name.bytes() {
        mix(byte);
    }
    for value in values {
        if !value.is_finite() {
            return f64::NAN;
        }
        for byte in format!("{value:.9e}").bytes() {
            mix(byte);
        }
    }
    1.0 + (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether `a` and `b` agree to a relative `1e-9` (a tiny absolute floor only when both are near
/// zero at points where the expressions have variables).
pub fn close(a: f64, b: f64, absolute_floor: f64) -> bool {
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    let scale = a.abs().max(b.abs());
    (a - b).abs() <= 1e-9 * scale + absolute_floor
}

/// Whether the relation chain holds at `env`; `None` when a side is undefined there.
pub fn holds(
    items: &[Expr],
    ops: &[RelOp],
    env: &Env,
    budget: &mut Budget,
) -> Result<Option<bool>, Exhausted> {
    let mut values = Vec::with_capacity(items.len());
    for item in items {
        let value = eval(item, env, budget)?;
        if value.is_nan() {
            return Ok(None);
        }
        values.push(value);
    }
    for (k, op) in ops.iter().enumerate() {
        let (a, b) = (values[k], values[k + 1]);
        let ok = match op {
            RelOp::Eq | RelOp::Approx => close(a, b, 1e-12),
            RelOp::Ne => !close(a, b, 1e-12),
            RelOp::Lt => a < b && !close(a, b, 0.0),
            RelOp::Le => a < b || close(a, b, 1e-12),
            RelOp::Gt => a > b && !close(a, b, 0.0),
            RelOp::Ge => a > b || close(a, b, 1e-12),
            RelOp::In => return Ok(None),
        };
        if !ok {
            return Ok(Some(false));
        }
    }
    Ok(Some(true))
}

/// Free symbols and unknown-function applications of `expr`, by display name, in order.
pub fn free_symbols(expr: &Expr, out: &mut Vec<String>) {
    match expr {
        Expr::Sym(name) => {
            if !out.contains(name) {
                out.push(name.clone());
            }
        }
        Expr::Func(name, args) if name.chars().count() == 1 || name.contains('_') || name.ends_with('\'') => {
            let mut inner = Vec::new();
            for arg in args {
                free_symbols(arg, &mut inner);
            }
            let key = expr.to_string();
            if inner.is_empty() {
                if !out.contains(&key) {
                    out.push(key);
                }
            } else {
                for name in inner {
                    if !out.contains(&name) {
                        out.push(name);
                    }
                }
            }
        }
        _ => expr.for_each_child(|child| free_symbols(child, out)),
    }
}

/// A small deterministic generator (SplitMix64) for evaluation points.
#[derive(Debug, Clone)]
pub struct Points(u64);

impl Points {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Points(seed)
    }

    /// The next value in `[0.25, 2.25)`: positive, so roots and logarithms are defined.
    pub fn next_value(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        0.25 + 2.0 * ((z >> 11) as f64 / (1u64 << 53) as f64)
    }
}
