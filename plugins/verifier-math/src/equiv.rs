//! Whether a predicted answer equals the gold one: exact where possible, then the documented
//! rounding rule, then numeric evaluation at seeded points — never string similarity.
//!
//! Order of decisions for two single values:
//! 1. both have exact forms ([`crate::exact`]) → equal iff the forms are equal;
//! 2. otherwise, or when exact forms differ, and exactly one side is a decimal literal and the
//!    other a constant whose decimal expansion does not terminate within the precision → equal
//!    iff both round to the same digits (see [`Options::precision_digits`]);
//! 3. no exact form (`\sin`, `2^{1/3}`) → equal iff they agree to a relative 1e-9 at 12 seeded
//!    points, 6 in [0.25, 2.25) and 6 off it (one for constants).
//!
//! Around that: lists and sets compare unordered (several distinct answers never equal a single
//! one), tuples and matrices in order, intervals by endpoints and brackets, equations up to a
//! nonzero factor, inequalities up to a positive factor and flipping, assignments (`x = 2`,
//! `f(x) = …`, `x \in S`) by their value, and a one-variable relation against an interval by
//! testing membership at every endpoint, beside it, between and beyond.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};

use crate::budget::{Budget, Exhausted};
use crate::exact::{RatFn, Why, exact, rat_mul};
use crate::lexer::{Number, RelOp, pow10};
use crate::numeric::{Env, Points, close, eval, free_symbols, holds};
use crate::parse::Expr;

/// How to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// A decimal literal matches a constant whose expansion does not terminate within this many
    /// places when both round to the same digits: this many decimal places, or this many
    /// significant digits when the constant is below 1 in magnitude (whichever is finer, so no
    /// small value is ever rounded away). A gold decimal is held to the same digits.
    pub precision_digits: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options { precision_digits: 6 }
    }
}

/// The decision and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the answers are equivalent.
    pub equal: bool,
    /// One line saying how it was decided.
    pub reason: String,
}

/// Most answers in one list; more is refused as not equal (comparisons are quadratic).
const MAX_ANSWERS: usize = 256;
/// Seeded points for expressions in variables.
const POINTS: usize = 6;

/// Compares a gold answer with a predicted one.
pub fn equivalent(
    gold: &Expr,
    pred: &Expr,
    options: &Options,
    budget: &mut Budget,
) -> Result<Outcome, Exhausted> {
    let mut cmp = Cmp { options: *options, budget, reason: String::new() };
    let equal = cmp.top(gold, pred)?;
    let reason = if cmp.reason.is_empty() {
        if equal { "equivalent".to_owned() } else { "different".to_owned() }
    } else {
        cmp.reason
    };
    Ok(Outcome { equal, reason })
}

struct Cmp<'b> {
    options: Options,
    budget: &'b mut Budget,
    reason: String,
}

/// The value an assignment gives (`x = 2`, `f(x) = x^2`, `(x, y) = (1, 2)`, `x \in S`,
/// `x = 1/3 \approx 0.33`), when `expr` is one.
fn assigned_value(expr: &Expr) -> Option<&Expr> {
    let Expr::Rel(items, ops) = expr else { return None };
    // `x \approx 11` states the value 11 as much as `x = 11` does.
    if !matches!(ops.first(), Some(RelOp::Eq | RelOp::In | RelOp::Approx)) || !is_name(&items[0]) {
        return None;
    }
    let mut value = &items[1];
    for (k, op) in ops.iter().enumerate().skip(1) {
        match op {
            RelOp::Eq => value = &items[k + 1],
            RelOp::Approx => break,
            _ => return None,
        }
    }
    Some(value)
}

/// Every value an assignment chain states (`x = 2 + 3 = 5`, `x = \pi \approx 3.14`), when
/// `expr` is an assignment: all of them must equal the other side, so `x = 2 = 1` matches no
/// single gold. A decimal after `\approx` is a stated approximation and is not graded (the
/// Math-Verify dev case `x=1/3\approx1.3` = `1/3` expects that); any other value after
/// `\approx` is (`x = 1 \approx 2` ≠ `1`).
fn chain_values(expr: &Expr) -> Option<Vec<&Expr>> {
    assigned_value(expr)?;
    let Expr::Rel(items, ops) = expr else { return None };
    let mut values = vec![&items[1]];
    for (k, op) in ops.iter().enumerate().skip(1) {
        let value = &items[k + 1];
        match op {
            RelOp::Approx if decimal_literal(value).is_some() => {}
            RelOp::Eq | RelOp::Approx => values.push(value),
            _ => break,
        }
    }
    Some(values)
}

/// Every member of a chain of equalities that names nothing (`5 + 5 + 1 = 11`,
/// `2 \cdot 3 = 6 = 3!`, `\sqrt{2} \approx 1.414`), when `expr` is one: each must equal a
/// single answer on the other side, so a false chain (`5 + 5 + 2 = 11`) matches no single value
/// and an equation (`2x = 4`, `x^2 + y^2 = 1`) is not its right side. A decimal after
/// `\approx` is a stated approximation and is not graded, as in an assignment chain.
fn unnamed_chain(expr: &Expr) -> Option<Vec<&Expr>> {
    let Expr::Rel(items, ops) = expr else { return None };
    if is_name(&items[0]) || !ops.iter().all(|op| matches!(op, RelOp::Eq | RelOp::Approx)) {
        return None;
    }
    let mut values = vec![&items[0]];
    for (op, value) in ops.iter().zip(&items[1..]) {
        if !(*op == RelOp::Approx && decimal_literal(value).is_some()) {
            values.push(value);
        }
    }
    Some(values)
}

/// Whether `expr` names something (the left side of an assignment).
fn is_name(expr: &Expr) -> bool {
    /// Letters that name a point, a segment or a product of unknowns: `A`, `AB`, `NO`.
    fn letters(expr: &Expr) -> bool {
        match expr {
            Expr::Sym(_) => true,
            Expr::Mul(items) => items.len() <= 4 && items.iter().all(|item| matches!(item, Expr::Sym(_))),
            _ => false,
        }
    }
    match expr {
        Expr::Sym(_) => true,
        // A named quantity of geometry: a segment `AB`, its length `|AB|`, a ratio of segments
        // `\frac{NO}{BO}` — no number in it, so `2x = 4` and `x^2 + y^2 = 1` stay equations.
        Expr::Mul(_) => letters(expr),
        Expr::Abs(inner) => letters(inner),
        Expr::Div(a, b) => letters(a) && letters(b),
        Expr::Func(name, args) => {
            (name.chars().count() == 1 || name.contains('_'))
                && args.iter().all(|a| matches!(a, Expr::Sym(_) | Expr::Num(_)))
        }
        Expr::Bracket('(', ')', items) => items.iter().all(is_name),
        Expr::Ratio(a, b) => is_name(a) && is_name(b),
        _ => false,
    }
}

/// The answers an expression stands for: lists and top-level sets flattened, `a ± b` as two
/// values, assignments by their value.
fn answers(expr: &Expr, out: &mut Vec<Expr>) {
    match expr {
        Expr::List(items) | Expr::Set(items) => {
            for item in items {
                answers(item, out);
            }
        }
        Expr::PlusMinus(a, b) => {
            out.push(Expr::Add(vec![(**a).clone(), (**b).clone()]));
            out.push(Expr::Add(vec![(**a).clone(), Expr::Neg(b.clone())]));
        }
        // A chain of several values stays whole: each must equal the other side.
        _ if chain_values(expr).is_some_and(|v| v.len() > 1) => out.push(expr.clone()),
        _ => match assigned_value(expr) {
            Some(value) => answers(value, out),
            None => out.push(expr.clone()),
        },
    }
}

/// `(name, assignment)` pairs when every answer is an assignment to a plain
/// symbol or another name (`x = 1, y = 2`, `AB = 4, CD = 5`), in the order written.
fn named(expr: &Expr) -> Option<Vec<(String, Expr)>> {
    let items = match expr {
        Expr::List(items) => items.as_slice(),
        one => std::slice::from_ref(one),
    };
    let mut pairs = Vec::new();
    for item in items {
        let Expr::Rel(sides, _) = item else { return None };
        let name = match &sides[0] {
            Expr::Sym(name) => name.clone(),
            other if matches!(other, Expr::Mul(_) | Expr::Abs(_) | Expr::Div(..)) => other.to_string(),
            _ => return None,
        };
        assigned_value(item)?;
        pairs.push((name, item.clone()));
    }
    Some(pairs)
}

/// The family of interchangeable names the pairs use, when they use one: the same letter with
/// indices (`x_1, x_2`) or the same name repeated (`x = 1, x = 2`) — roots of one equation,
/// whose order is not part of the answer. `None` for distinct names (`x, y`; `x_1, y_1`).
fn name_family(pairs: &[(String, Expr)]) -> Option<&str> {
    let base = |name: &str| name.split('_').next().unwrap_or(name).to_owned();
    let first = &pairs.first()?.0;
    let family = first.split('_').next().unwrap_or(first);
    let same_base = pairs.iter().all(|(n, _)| base(n) == family);
    let all_indexed = pairs.iter().all(|(n, _)| n.contains('_'));
    let all_same = pairs.iter().all(|(n, _)| n == first);
    (same_base && (all_indexed || all_same)).then_some(family)
}

fn decimal_literal(expr: &Expr) -> Option<(&Number, bool)> {
    match expr {
        Expr::Num(n) if n.decimal => Some((n, false)),
        Expr::Neg(inner) => match &**inner {
            Expr::Num(n) if n.decimal => Some((n, true)),
            _ => None,
        },
        _ => None,
    }
}

fn infinity_sign(expr: &Expr) -> Option<bool> {
    match expr {
        Expr::Infinity => Some(true),
        Expr::Neg(inner) => infinity_sign(inner).map(|s| !s),
        Expr::Add(items) if items.len() == 1 => infinity_sign(&items[0]),
        _ => None,
    }
}

fn interval(expr: &Expr) -> Option<(&Expr, &Expr, bool, bool)> {
    match expr {
        Expr::Bracket(open @ ('(' | '['), close @ (')' | ']'), items) if items.len() == 2 => {
            Some((&items[0], &items[1], *open == '[', *close == ']'))
        }
        _ => None,
    }
}

fn is_region(expr: &Expr) -> bool {
    interval(expr).is_some() || matches!(expr, Expr::SetOp(..) | Expr::Set(_))
}

fn is_matrix(expr: &Expr) -> bool {
    match expr {
        Expr::Matrix(_) => true,
        Expr::Add(items) | Expr::Mul(items) => items.iter().any(is_matrix),
        Expr::Neg(a) => is_matrix(a),
        _ => false,
    }
}

/// Round half away from zero of `q · 10^places`.
fn round_scaled(q: &BigRational, places: u64, budget: &mut Budget) -> Result<BigInt, Exhausted> {
    let scaled = rat_mul(q, &BigRational::from_integer(pow10(places, budget)?), budget)?;
    Ok(scaled.round().to_integer())
}

/// ⌊log10 |q|⌋ for q ≠ 0.
fn floor_log10(q: &BigRational, budget: &mut Budget) -> Result<i64, Exhausted> {
    let q = q.abs();
    let estimate =
        ((q.numer().bits() as f64 - q.denom().bits() as f64) * std::f64::consts::LOG10_2).floor() as i64;
    let power = |k: i64, budget: &mut Budget| -> Result<BigRational, Exhausted> {
        let p = BigRational::from_integer(pow10(k.unsigned_abs(), budget)?);
        Ok(if k >= 0 { p } else { p.recip() })
    };
    let mut k = estimate;
    while power(k, budget)? > q {
        k -= 1;
    }
    while power(k + 1, budget)? <= q {
        k += 1;
    }
    Ok(k)
}

impl Cmp<'_> {
    fn top(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        // A gold that names its values (`x = 1, y = 2`) is compared name by name: the prediction
        // must give the same names. Only one family of interchangeable names (`x_1, x_2`, or `x`
        // repeated) is compared by value, in any order, and then a prediction that names its
        // values must use that family.
        if let Some(g) = named(gold).filter(|g| g.len() >= 2) {
            match name_family(&g) {
                None => return self.by_name(&g, pred, named(pred)),
                Some(family) => {
                    if let Some(p) = named(pred) {
                        if let Some((name, _)) =
                            p.iter().find(|(n, _)| n.split('_').next().unwrap_or(n) != family)
                        {
                            self.reason = format!("gold names its values {family}…, the prediction {name}");
                            return Ok(false);
                        }
                    }
                }
            }
        }
        if let (Expr::Rel(gi, go), Expr::Rel(pi, po)) = (gold, pred) {
            // An assignment against the same equation rearranged (`y = 2x`, `2x = y`).
            if assigned_value(gold).is_some() != assigned_value(pred).is_some()
                && self.relations(gi, go, pi, po)?
            {
                self.reason = "the same equation, rearranged".into();
                return Ok(true);
            }
        }
        let (mut g, mut p) = (Vec::new(), Vec::new());
        answers(gold, &mut g);
        answers(pred, &mut p);
        // A gold that lists its answers (`1, 3`, `{1,3}` in LaTeX grouping braces) against the
        // same values in parentheses: `(1, 3)` lists them too. Not an explicit set `\{1, 3\}`,
        // which an open interval `(1, 3)` is not, and not a gold tuple or interval.
        if let (Expr::List(_), [Expr::Bracket('(', ')', items)]) = (gold, p.as_slice()) {
            if g.len() >= 2 && items.len() == g.len() {
                p = items.clone();
            }
        }
        if g.len() == 1 && p.len() == 1 {
            return self.one(&g[0], &p[0]);
        }
        if g.len() > MAX_ANSWERS || p.len() > MAX_ANSWERS {
            self.reason = format!("more than {MAX_ANSWERS} answers");
            return Ok(false);
        }
        let g = self.distinct(g)?;
        let p = self.distinct(p)?;
        if g.len() != p.len() {
            self.reason = format!("{} distinct gold answers, {} distinct predicted", g.len(), p.len());
            return Ok(false);
        }
        for want in &g {
            let mut found = false;
            for have in &p {
                if self.one(want, have)? {
                    found = true;
                    break;
                }
            }
            if !found {
                self.reason = format!("gold answer {want} has no equal among the predicted ones");
                return Ok(false);
            }
        }
        for have in &p {
            let mut found = false;
            for want in &g {
                if self.one(want, have)? {
                    found = true;
                    break;
                }
            }
            if !found {
                self.reason = format!("predicted answer {have} is not a gold answer");
                return Ok(false);
            }
        }
        self.reason = format!("the same {} answers, in any order", g.len());
        Ok(true)
    }

    /// A gold with distinct names against the prediction's named values (`None`: it names none).
    fn by_name(
        &mut self,
        gold: &[(String, Expr)],
        pred: &Expr,
        pred_named: Option<Vec<(String, Expr)>>,
    ) -> Result<bool, Exhausted> {
        let Some(pred_named) = pred_named else { return self.in_gold_order(gold, pred) };
        let pred = pred_named;
        let names = |pairs: &[(String, Expr)]| {
            let mut names: Vec<String> = pairs.iter().map(|(n, _)| n.clone()).collect();
            names.sort();
            names.dedup();
            names
        };
        let (gold_names, pred_names) = (names(gold), names(&pred));
        if gold_names != pred_names {
            self.reason = format!("names {} against {}", gold_names.join(", "), pred_names.join(", "));
            return Ok(false);
        }
        for name in &gold_names {
            let values = |pairs: &[(String, Expr)]| -> Vec<Expr> {
                pairs.iter().filter(|(n, _)| n == name).map(|(_, item)| item.clone()).collect()
            };
            let (mut g, mut p) = (values(gold), values(&pred));
            let equal = if g.len() == 1 && p.len() == 1 {
                self.one(&g[0], &p[0])?
            } else {
                self.top(&Expr::List(std::mem::take(&mut g)), &Expr::List(std::mem::take(&mut p)))?
            };
            if !equal {
                self.reason = format!("{name}: {}", self.reason);
                return Ok(false);
            }
        }
        self.reason = "every named value equal".into();
        Ok(true)
    }

    /// A gold with distinct names (`p = 5, q = 2`) against bare values (`5, 2`, `(5, 2)`, `5
    /// and 2`): the values answer the names in the order the gold writes them, so `2, 5` is
    /// wrong, and as many values as names are needed.
    fn in_gold_order(&mut self, gold: &[(String, Expr)], pred: &Expr) -> Result<bool, Exhausted> {
        let items = match pred {
            Expr::List(items) | Expr::Bracket('(', ')', items) => items.as_slice(),
            one => std::slice::from_ref(one),
        };
        if items.iter().any(|item| assigned_value(item).is_some()) {
            self.reason = "the gold names its values; the prediction does not name them all".into();
            return Ok(false);
        }
        if items.len() != gold.len() {
            self.reason = format!("{} named gold values, {} predicted", gold.len(), items.len());
            return Ok(false);
        }
        for ((name, want), have) in gold.iter().zip(items) {
            if !self.one(want, have)? {
                self.reason = format!("{name}, in the gold's order: {}", self.reason);
                return Ok(false);
            }
        }
        self.reason = "every named value equal, in the gold's order".into();
        Ok(true)
    }

    fn distinct(&mut self, items: Vec<Expr>) -> Result<Vec<Expr>, Exhausted> {
        let mut kept: Vec<Expr> = Vec::new();
        for item in items {
            let mut duplicate = false;
            for seen in &kept {
                if self.one(seen, &item)? {
                    duplicate = true;
                    break;
                }
            }
            if !duplicate {
                kept.push(item);
            }
        }
        Ok(kept)
    }

    /// Two single answers.
    fn one(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        if self.one_value(gold, pred)? {
            return Ok(true);
        }
        // An assignment against the same equation written otherwise (`y = 2x` against `2x = y`,
        // `y - 2x = 0`, `2y = 4x`): as relations, up to a nonzero factor.
        if let (Expr::Rel(gi, go), Expr::Rel(pi, po)) = (gold, pred) {
            if assigned_value(gold).is_some() || assigned_value(pred).is_some() {
                let reason = std::mem::take(&mut self.reason);
                if self.relations(gi, go, pi, po)? {
                    self.reason = "the same equation, rearranged".into();
                    return Ok(true);
                }
                self.reason = reason;
            }
        }
        Ok(false)
    }

    /// Two single answers, assignments by their value.
    fn one_value(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        self.budget.charge(1, "comparing")?;
        for (chain, other, chain_is_gold) in [(gold, pred, true), (pred, gold, false)] {
            let unnamed = || unnamed_chain(chain).filter(|_| !matches!(other, Expr::Rel(..)));
            let Some(values) = chain_values(chain).filter(|v| v.len() > 1).or_else(unnamed) else { continue };
            for value in values {
                let equal =
                    if chain_is_gold { self.one_value(value, other)? } else { self.one_value(other, value)? };
                if !equal {
                    self.reason = format!("the chain's value {value} differs: {}", self.reason);
                    return Ok(false);
                }
            }
            self.reason = "every value of the chain equal".into();
            return Ok(true);
        }
        let gold = assigned_value(gold).unwrap_or(gold);
        let pred = assigned_value(pred).unwrap_or(pred);
        match (gold, pred) {
            (Expr::Text(a), Expr::Text(b)) => {
                self.reason = if a == b { "the same words".into() } else { "different words".into() };
                Ok(a == b)
            }
            (Expr::Text(t), Expr::Sym(s)) | (Expr::Sym(s), Expr::Text(t)) => Ok(*t == s.to_lowercase()),
            (Expr::Text(_), _) | (_, Expr::Text(_)) => {
                self.reason = "words against a value".into();
                Ok(false)
            }
            (Expr::Percent(a), Expr::Percent(b)) => self.one(a, b),
            (Expr::Percent(a), other) => {
                // 28% matches 28 and 0.28.
                Ok(self.scalar(a, other)? || self.scalar(gold, other)?)
            }
            (other, Expr::Percent(a)) => Ok(self.scalar(other, a)? || self.scalar(other, pred)?),
            (Expr::List(_) | Expr::Set(_) | Expr::PlusMinus(..), _)
            | (_, Expr::List(_) | Expr::Set(_) | Expr::PlusMinus(..))
                if !(is_region(gold) && is_region(pred)) =>
            {
                self.top(gold, pred)
            }
            _ if is_matrix(gold) || is_matrix(pred) => self.matrices(gold, pred),
            (Expr::Rel(gi, go), Expr::Rel(pi, po)) => self.relations(gi, go, pi, po),
            (Expr::Rel(..), other) | (other, Expr::Rel(..)) if is_region(other) => self.regions(gold, pred),
            (Expr::Rel(..), _) | (_, Expr::Rel(..)) => {
                self.reason = "a relation against a value".into();
                Ok(false)
            }
            (Expr::Bracket(go, gc, gi), Expr::Bracket(po, pc, pi)) => {
                if gi.len() != pi.len() {
                    self.reason = format!("{} items against {}", gi.len(), pi.len());
                    return Ok(false);
                }
                if (go, gc) != (po, pc) {
                    self.reason = format!("brackets {go}{gc} against {po}{pc}");
                    return Ok(false);
                }
                for (a, b) in gi.iter().zip(pi) {
                    if !self.one(a, b)? {
                        return Ok(false);
                    }
                }
                self.reason = "equal item by item".into();
                Ok(true)
            }
            (Expr::SetOp(..), _) | (_, Expr::SetOp(..)) => self.regions(gold, pred),
            (Expr::Bracket(..), _) | (_, Expr::Bracket(..)) => {
                self.reason = "a tuple or interval against a value".into();
                Ok(false)
            }
            (Expr::Ratio(ga, gb), Expr::Ratio(pa, pb)) => {
                if self.one(ga, pa)? && self.one(gb, pb)? {
                    return Ok(true);
                }
                self.scalar(gold, pred)
            }
            _ => self.scalar(gold, pred),
        }
    }

    fn scalar(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        match (infinity_sign(gold), infinity_sign(pred)) {
            (Some(a), Some(b)) => {
                self.reason = "infinities".into();
                return Ok(a == b);
            }
            (Some(_), None) | (None, Some(_)) => {
                self.reason = "infinity against a finite value".into();
                return Ok(false);
            }
            (None, None) => {}
        }
        let g = exact(gold, self.budget);
        let p = exact(pred, self.budget);
        let (g, p) = match (g, p) {
            (Err(Why::Exhausted(e)), _) | (_, Err(Why::Exhausted(e))) => return Err(e),
            (Err(Why::NotScalar(what)), _) | (_, Err(Why::NotScalar(what))) => {
                self.reason = format!("not comparable as values: {what}");
                return Ok(false);
            }
            (Err(Why::Undefined(what)), _) | (_, Err(Why::Undefined(what))) => {
                self.reason = format!("undefined: {what}");
                return Ok(false);
            }
            (g, p) => (g.ok(), p.ok()),
        };
        if let (Some(a), Some(b)) = (&g, &p) {
            if a.equals(b, self.budget)? {
                self.reason = "equal as exact values".into();
                return Ok(true);
            }
        }
        if let Some(equal) = self.rounding(gold, pred, g.as_ref(), p.as_ref())? {
            return Ok(equal);
        }
        if g.is_some() && p.is_some() {
            self.reason = "different exact values".into();
            return Ok(false);
        }
        self.numeric(gold, pred)
    }

    /// The rounding rule, when exactly one side is a decimal literal and the other a constant.
    fn rounding(
        &mut self,
        gold: &Expr,
        pred: &Expr,
        g: Option<&RatFn>,
        p: Option<&RatFn>,
    ) -> Result<Option<bool>, Exhausted> {
        let (literal, negative, other, other_exact) = match (decimal_literal(gold), decimal_literal(pred)) {
            (Some((n, neg)), None) => (n, neg, pred, p),
            (None, Some((n, neg))) => (n, neg, gold, g),
            _ => return Ok(None),
        };
        let mut symbols = Vec::new();
        free_symbols(other, &mut symbols);
        if !symbols.is_empty() || other_exact.is_some_and(RatFn::has_vars) {
            return Ok(None);
        }
        // The spec's digits for both sides: a short gold decimal does not loosen the rule
        // (`0.3` ≠ `1/3`, `3.14` ≠ `π`); a dataset that wants that sets `precision_digits`.
        let digits = self.options.precision_digits;
        let d = if negative { -literal.value.clone() } else { literal.value.clone() };
        if let Some(x) = other_exact.and_then(RatFn::as_rational) {
            let digits = u64::from(digits);
            let scaled = rat_mul(&x, &BigRational::from_integer(pow10(digits, self.budget)?), self.budget)?;
            if scaled.is_integer() {
                self.reason = format!("{x} terminates within {digits} places: exact comparison, different");
                return Ok(Some(false));
            }
            let places = if x.is_zero() {
                digits
            } else {
                let e = floor_log10(&x, self.budget)?;
                (digits as i64).max(digits as i64 - 1 - e).max(0) as u64
            };
            let (nx, nd) = (round_scaled(&x, places, self.budget)?, round_scaled(&d, places, self.budget)?);
            let equal = nx == nd;
            self.reason = format!(
                "decimal {} against {x}, rounded to {places} places: {}",
                d,
                if equal { "equal" } else { "different" }
            );
            return Ok(Some(equal));
        }
        let xf = eval(other, &Env::new(), self.budget)?;
        if !xf.is_finite() || xf == 0.0 {
            return Ok(None);
        }
        let e = xf.abs().log10().floor() as i64;
        let places = (i64::from(digits)).max(i64::from(digits) - 1 - e).max(0);
        let scaled = xf * 10f64.powi(places as i32);
        if !scaled.is_finite() || scaled.abs() > 1e14 {
            self.reason = "too many digits to round a floating-point value".into();
            return Ok(Some(false));
        }
        let nd = round_scaled(&d, places as u64, self.budget)?;
        let Some(nd) = nd.to_f64() else { return Ok(Some(false)) };
        let fraction = scaled - scaled.floor();
        let equal = if (fraction - 0.5).abs() < 1e-6 {
            // Too close to a rounding boundary for f64: accept either neighbour.
            nd == scaled.floor() || nd == scaled.floor() + 1.0
        } else {
            nd == scaled.round()
        };
        self.reason = format!(
            "decimal {} against {xf:.12}, rounded to {places} places: {}",
            literal.value,
            if equal { "equal" } else { "different" }
        );
        Ok(Some(equal))
    }

    fn numeric(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        let mut symbols = Vec::new();
        free_symbols(gold, &mut symbols);
        free_symbols(pred, &mut symbols);
        if symbols.is_empty() {
            let (a, b) = (eval(gold, &Env::new(), self.budget)?, eval(pred, &Env::new(), self.budget)?);
            let equal = a.is_finite() && b.is_finite() && close(a, b, 0.0);
            self.reason = format!(
                "numerically {a:.12e} against {b:.12e}: {}",
                if equal { "equal" } else { "different" }
            );
            return Ok(equal);
        }
        let mut points = Points::new(0x5eed);
        let mut agreed = 0;
        for _ in 0..POINTS {
            let env: Env = symbols.iter().map(|s| (s.clone(), points.next_value())).collect();
            let (a, b) = (eval(gold, &env, self.budget)?, eval(pred, &env, self.budget)?);
            if a.is_nan() && b.is_nan() {
                continue;
            }
            if !close(a, b, 1e-12) {
                self.reason = format!("differ at a seeded point ({a:.12e} against {b:.12e})");
                return Ok(false);
            }
            agreed += 1;
        }
        // Then points off [0.25, 2.25): negative and larger values, where `|x|`, `\sqrt{x^2}`,
        // `\max(x, 0)` or `\min(x, 3)` differ from `x`. A point where either side is undefined
        // is skipped (`\ln x` against `\ln|x|` may differ in domain only).
        for k in 0..POINTS {
            let env: Env = symbols
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let v = points.next_value();
                    (s.clone(), if (k + i) % 2 == 0 { -v } else { 2.0 * v + 2.0 })
                })
                .collect();
            let (a, b) = (eval(gold, &env, self.budget)?, eval(pred, &env, self.budget)?);
            if a.is_nan() || b.is_nan() {
                continue;
            }
            if !close(a, b, 1e-12) {
                self.reason =
                    format!("differ at a seeded point off [0.25, 2.25) ({a:.12e} against {b:.12e})");
                return Ok(false);
            }
            agreed += 1;
        }
        let equal = agreed >= 3;
        self.reason = format!("agree at {agreed} of {} seeded points", 2 * POINTS);
        Ok(equal)
    }

    fn matrices(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        let (Some(g), Some(p)) = (matrix_value(gold, self.budget)?, matrix_value(pred, self.budget)?) else {
            self.reason = "a matrix against something else".into();
            return Ok(false);
        };
        if g.len() != p.len() || g.iter().zip(&p).any(|(a, b)| a.len() != b.len()) {
            self.reason = "matrices of different shapes".into();
            return Ok(false);
        }
        for (a, b) in g.iter().flatten().zip(p.iter().flatten()) {
            if !self.one(a, b)? {
                self.reason = format!("matrix entries differ: {}", self.reason);
                return Ok(false);
            }
        }
        self.reason = "equal entry by entry".into();
        Ok(true)
    }

    fn relations(&mut self, gi: &[Expr], go: &[RelOp], pi: &[Expr], po: &[RelOp]) -> Result<bool, Exhausted> {
        let (gi, go) = oriented(gi, go);
        let (pi, po) = oriented(pi, po);
        if go == po && gi.len() == pi.len() {
            let mut all = true;
            for (a, b) in gi.iter().zip(&pi) {
                if !self.one(a, b)? {
                    all = false;
                    break;
                }
            }
            if all {
                self.reason = "the same relation".into();
                return Ok(true);
            }
            if go.len() == 1 && !matches!(go[0], RelOp::In | RelOp::Approx) {
                let positive = matches!(go[0], RelOp::Lt | RelOp::Le);
                if let Some(equal) = self.proportional(&gi, &pi, positive)? {
                    return Ok(equal);
                }
            }
        }
        if go.iter().chain(&po).all(|op| matches!(op, RelOp::Lt | RelOp::Le | RelOp::Gt | RelOp::Ge)) {
            let g = Expr::Rel(gi, go);
            let p = Expr::Rel(pi, po);
            return self.regions(&g, &p);
        }
        self.reason = "different relations".into();
        Ok(false)
    }

    /// `g₀ − g₁ = c · (p₀ − p₁)` for a nonzero (or positive) constant `c`.
    fn proportional(&mut self, g: &[Expr], p: &[Expr], positive: bool) -> Result<Option<bool>, Exhausted> {
        let difference =
            |sides: &[Expr]| Expr::Add(vec![sides[0].clone(), Expr::Neg(Box::new(sides[1].clone()))]);
        let (dg, dp) = (difference(g), difference(p));
        match (exact(&dg, self.budget), exact(&dp, self.budget)) {
            (Err(Why::Exhausted(e)), _) | (_, Err(Why::Exhausted(e))) => Err(e),
            (Ok(a), Ok(b)) => {
                let constant_dens = a.den.as_rational().is_some() && b.den.as_rational().is_some();
                if positive && !constant_dens {
                    return Ok(None);
                }
                // With constant denominators, a negative one flips the numerator's sign.
                let signed = |f: &RatFn| {
                    if f.den.as_rational().is_some_and(|d| d.is_negative()) {
                        f.num.neg()
                    } else {
                        f.num.clone()
                    }
                };
                let equal = signed(&a).proportional(&signed(&b), positive, self.budget)?;
                self.reason = format!(
                    "{} up to a {} factor",
                    if equal { "the same relation" } else { "different relations" },
                    if positive { "positive" } else { "nonzero" }
                );
                Ok(Some(equal))
            }
            _ => {
                // Numerically: the ratio of the two sides' differences is one constant.
                let mut symbols = Vec::new();
                free_symbols(&dg, &mut symbols);
                free_symbols(&dp, &mut symbols);
                let mut points = Points::new(0x5eed);
                let mut ratio: Option<f64> = None;
                for _ in 0..POINTS {
                    let env: Env = symbols.iter().map(|s| (s.clone(), points.next_value())).collect();
                    let (a, b) = (eval(&dg, &env, self.budget)?, eval(&dp, &env, self.budget)?);
                    if !a.is_finite() || !b.is_finite() || b == 0.0 {
                        continue;
                    }
                    let r = a / b;
                    match ratio {
                        None => ratio = Some(r),
                        Some(first) if close(first, r, 0.0) => {}
                        Some(_) => return Ok(Some(false)),
                    }
                }
                Ok(ratio.map(|r| r != 0.0 && (!positive || r > 0.0)))
            }
        }
    }

    /// Sets of reals: structurally (unions in any order), else by membership at test points.
    fn regions(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        let (mut gp, mut pp) = (Vec::new(), Vec::new());
        union_parts(gold, &mut gp);
        union_parts(pred, &mut pp);
        if gp.len() == pp.len()
            && gp.iter().chain(&pp).all(|e| interval(e).is_some() || matches!(e, Expr::Set(_)))
        {
            let mut all = true;
            for want in &gp {
                let mut found = false;
                for have in &pp {
                    if self.region_part(want, have)? {
                        found = true;
                        break;
                    }
                }
                if !found {
                    all = false;
                    break;
                }
            }
            if all {
                self.reason = "the same intervals".into();
                return Ok(true);
            }
        }
        self.membership(gold, pred)
    }

    fn region_part(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        match (interval(gold), interval(pred)) {
            (Some((gl, gh, glc, ghc)), Some((pl, ph, plc, phc))) => {
                let ends_ok = (glc == plc || infinity_sign(gl).is_some())
                    && (ghc == phc || infinity_sign(gh).is_some());
                Ok(ends_ok && self.one(gl, pl)? && self.one(gh, ph)?)
            }
            (None, None) => self.top(gold, pred),
            _ => Ok(false),
        }
    }

    fn membership(&mut self, gold: &Expr, pred: &Expr) -> Result<bool, Exhausted> {
        let (Some(gv), Some(pv)) = (region_variable(gold), region_variable(pred)) else {
            self.reason = "not comparable as sets of one variable".into();
            return Ok(false);
        };
        let mut critical = Vec::new();
        critical_points(gold, self.budget, &mut critical)?;
        critical_points(pred, self.budget, &mut critical)?;
        critical.retain(|c| c.is_finite());
        let mut tests: Vec<f64> = Vec::new();
        for &c in &critical {
            let eps = 1e-7 * c.abs().max(1.0);
            tests.extend([c, -c, c - eps, c + eps, -c - eps, -c + eps]);
        }
        let mut sorted = critical.clone();
        sorted.extend(critical.iter().map(|c| -c));
        sorted.sort_by(f64::total_cmp);
        sorted.dedup();
        for pair in sorted.windows(2) {
            tests.push((pair[0] + pair[1]) / 2.0);
        }
        let low = sorted.first().copied().unwrap_or(0.0);
        let high = sorted.last().copied().unwrap_or(0.0);
        tests.extend([low - 1.0, high + 1.0, low - 1000.0, high + 1000.0, 0.0, 0.5, -0.5]);
        let mut points = Points::new(0x5eed);
        for _ in 0..8 {
            tests.push((points.next_value() - 1.25) * 8.0);
        }
        tests.truncate(400);
        let mut defined = 0;
        for t in tests {
            let (a, b) =
                (member(gold, gv.as_deref(), t, self.budget)?, member(pred, pv.as_deref(), t, self.budget)?);
            match (a, b) {
                (Some(a), Some(b)) if a != b => {
                    self.reason = format!("membership of {t} differs");
                    return Ok(false);
                }
                (Some(_), Some(_)) => defined += 1,
                _ => {}
            }
        }
        self.reason = format!("the same set: membership agrees at {defined} test points");
        Ok(defined >= 3)
    }
}

fn oriented(items: &[Expr], ops: &[RelOp]) -> (Vec<Expr>, Vec<RelOp>) {
    if ops.iter().all(|op| matches!(op, RelOp::Gt | RelOp::Ge)) {
        (items.iter().rev().cloned().collect(), ops.iter().rev().map(|op| op.flipped()).collect())
    } else {
        (items.to_vec(), ops.to_vec())
    }
}

fn union_parts(expr: &Expr, out: &mut Vec<Expr>) {
    match expr {
        Expr::SetOp('∪', items) => {
            for item in items {
                union_parts(item, out);
            }
        }
        other => out.push(other.clone()),
    }
}

/// The variable a relation constrains (`None` for an interval or set, which needs none);
/// `Err` — the outer `None` — when a relation has no single variable.
fn region_variable(expr: &Expr) -> Option<Option<String>> {
    match expr {
        Expr::Rel(items, _) => {
            // A bare symbol or `f(x)` in the chain is the variable; else the single free symbol.
            for item in items {
                if matches!(item, Expr::Sym(_) | Expr::Func(..)) {
                    let mut symbols = Vec::new();
                    free_symbols(item, &mut symbols);
                    if !symbols.is_empty() {
                        return Some(Some(item.to_string()));
                    }
                }
            }
            let mut symbols = Vec::new();
            free_symbols(expr, &mut symbols);
            (symbols.len() == 1).then(|| Some(symbols.remove(0)))
        }
        _ => {
            let mut symbols = Vec::new();
            free_symbols(expr, &mut symbols);
            symbols.is_empty().then_some(None)
        }
    }
}

fn critical_points(expr: &Expr, budget: &mut Budget, out: &mut Vec<f64>) -> Result<(), Exhausted> {
    match expr {
        Expr::Rel(items, _) | Expr::SetOp(_, items) | Expr::Set(items) | Expr::Bracket(_, _, items) => {
            for item in items {
                let mut symbols = Vec::new();
                free_symbols(item, &mut symbols);
                if matches!(item, Expr::SetOp(..) | Expr::Set(_) | Expr::Bracket(..)) {
                    // A part of a union or set (`[0, 1] ∪ \{3.7\}`): its own endpoints and points.
                    critical_points(item, budget, out)?;
                } else if symbols.is_empty() {
                    out.push(eval(item, &Env::new(), budget)?);
                } else {
                    critical_points(item, budget, out)?;
                }
            }
        }
        Expr::Num(n) => out.push(n.value.to_f64().unwrap_or(f64::NAN)),
        Expr::Add(items) | Expr::Mul(items) => {
            for item in items {
                critical_points(item, budget, out)?;
            }
        }
        Expr::Neg(a) | Expr::Abs(a) => critical_points(a, budget, out)?,
        Expr::Div(a, b) | Expr::Pow(a, b) => {
            critical_points(a, budget, out)?;
            critical_points(b, budget, out)?;
        }
        _ => {}
    }
    Ok(())
}

/// Whether `t` is in the set `expr` describes; `None` when undefined there.
fn member(
    expr: &Expr,
    variable: Option<&str>,
    t: f64,
    budget: &mut Budget,
) -> Result<Option<bool>, Exhausted> {
    budget.charge(1, "membership tests")?;
    let value = |e: &Expr, budget: &mut Budget| eval(e, &Env::new(), budget);
    Ok(match expr {
        Expr::Rel(items, ops) => {
            let Some(variable) = variable else { return Ok(None) };
            let env: Env = [(variable.to_owned(), t)].into_iter().collect();
            holds(items, ops, &env, budget)?
        }
        Expr::Set(items) => {
            let mut any = false;
            for item in items {
                let v = value(item, budget)?;
                if v.is_nan() {
                    return Ok(None);
                }
                any |= close(v, t, 1e-12);
            }
            Some(any)
        }
        Expr::SetOp(op, items) => {
            let mut results = Vec::new();
            for item in items {
                match member(item, variable, t, budget)? {
                    Some(r) => results.push(r),
                    None => return Ok(None),
                }
            }
            Some(match op {
                '∪' => results.iter().any(|r| *r),
                '∩' => results.iter().all(|r| *r),
                _ => results.first().copied().unwrap_or(false) && !results.iter().skip(1).any(|r| *r),
            })
        }
        _ => match interval(expr) {
            Some((lo, hi, lo_closed, hi_closed)) => {
                let (l, h) = (value(lo, budget)?, value(hi, budget)?);
                if l.is_nan() || h.is_nan() {
                    return Ok(None);
                }
                let above = if lo_closed { t > l || close(t, l, 1e-12) } else { t > l && !close(t, l, 0.0) };
                let below = if hi_closed { t < h || close(t, h, 1e-12) } else { t < h && !close(t, h, 0.0) };
                Some(above && below)
            }
            None => None,
        },
    })
}

/// Most syntax nodes a matrix-valued expression may expand to: products copy entries into
/// sums of products, so a chain of `k` products grows like `2^k` (22 small matrices were 6.7 GB);
/// real answers stay in the hundreds.
const MAX_MATRIX_NODES: u64 = 200_000;

/// Syntax nodes of `expr`, counting no further than `cap`.
fn node_count(expr: &Expr, cap: u64) -> u64 {
    fn walk(expr: &Expr, cap: u64, total: &mut u64) {
        *total += 1;
        expr.for_each_child(|child| {
            if *total < cap {
                walk(child, cap, total);
            }
        });
    }
    let mut total = 0;
    walk(expr, cap, &mut total);
    total.min(cap)
}

/// Refuses (as an exhausted budget) a matrix expansion of `nodes` syntax nodes beyond
/// [`MAX_MATRIX_NODES`], and charges the budget for one that fits, before it is built.
fn charge_matrix(nodes: u64, budget: &mut Budget) -> Result<(), Exhausted> {
    if nodes > MAX_MATRIX_NODES {
        return Err(Exhausted { limit: MAX_MATRIX_NODES, what: "a matrix expression too large to expand" });
    }
    budget.charge(nodes, "expanding a matrix expression")
}

/// The largest entry of a matrix, in syntax nodes (capped).
fn largest_entry(m: &[Vec<Expr>]) -> u64 {
    m.iter().flatten().map(|e| node_count(e, MAX_MATRIX_NODES + 1)).max().unwrap_or(0)
}

/// Entries of a matrix-valued expression: a matrix, sums and differences of matrices, scalar
/// multiples and matrix products; `None` when it is not one. Every expansion is charged to the
/// budget by the nodes it builds, and one beyond [`MAX_MATRIX_NODES`] is refused before it is
/// built (a chain of products grows exponentially).
fn matrix_value(expr: &Expr, budget: &mut Budget) -> Result<Option<Vec<Vec<Expr>>>, Exhausted> {
    Ok(match expr {
        Expr::Matrix(rows) => Some(rows.clone()),
        Expr::Neg(a) => {
            let Some(m) = matrix_value(a, budget)? else { return Ok(None) };
            let entries = m.iter().flatten().count() as u64;
            charge_matrix(entries.saturating_mul(largest_entry(&m) + 1), budget)?;
            Some(m.into_iter().map(|row| row.into_iter().map(|e| Expr::Neg(Box::new(e))).collect()).collect())
        }
        Expr::Add(items) => {
            let mut total: Option<Vec<Vec<Expr>>> = None;
            for item in items {
                let Some(m) = matrix_value(item, budget)? else { return Ok(None) };
                total = Some(match total {
                    None => m,
                    Some(t) => {
                        if t.len() != m.len() || t.iter().zip(&m).any(|(a, b)| a.len() != b.len()) {
                            return Ok(None);
                        }
                        let entries = t.iter().flatten().count() as u64;
                        let nodes =
                            entries.saturating_mul(largest_entry(&t).saturating_add(largest_entry(&m)) + 1);
                        charge_matrix(nodes, budget)?;
                        t.into_iter()
                            .zip(m)
                            .map(|(ra, rb)| {
                                ra.into_iter().zip(rb).map(|(a, b)| Expr::Add(vec![a, b])).collect()
                            })
                            .collect()
                    }
                });
            }
            total
        }
        Expr::Mul(items) => {
            let mut scalar: Vec<Expr> = Vec::new();
            let mut product: Option<Vec<Vec<Expr>>> = None;
            for item in items {
                if is_matrix(item) {
                    let Some(m) = matrix_value(item, budget)? else { return Ok(None) };
                    product = Some(match product {
                        None => m,
                        Some(a) => {
                            let Some(inner) = a.first().map(Vec::len) else { return Ok(None) };
                            if inner != m.len() || m.is_empty() {
                                return Ok(None);
                            }
                            let width = m[0].len();
                            let entries = (a.len() as u64).saturating_mul(width as u64);
                            let per_entry = (inner as u64)
                                .saturating_mul(largest_entry(&a).saturating_add(largest_entry(&m)) + 1)
                                + 1;
                            charge_matrix(entries.saturating_mul(per_entry), budget)?;
                            a.iter()
                                .map(|row| {
                                    (0..width)
                                        .map(|j| {
                                            Expr::Add(
                                                (0..inner)
                                                    .map(|k| Expr::Mul(vec![row[k].clone(), m[k][j].clone()]))
                                                    .collect(),
                                            )
                                        })
                                        .collect()
                                })
                                .collect()
                        }
                    });
                } else {
                    scalar.push(item.clone());
                }
            }
            let Some(product) = product else { return Ok(None) };
            let entries = product.iter().flatten().count() as u64;
            if entries > 10_000 {
                return Ok(None);
            }
            if !scalar.is_empty() {
                let scalar_nodes: u64 = scalar.iter().map(|s| node_count(s, MAX_MATRIX_NODES + 1)).sum();
                charge_matrix(entries.saturating_mul(scalar_nodes + largest_entry(&product) + 1), budget)?;
            }
            Some(
                product
                    .into_iter()
                    .map(|row| {
                        row.into_iter()
                            .map(|e| {
                                if scalar.is_empty() {
                                    e
                                } else {
                                    Expr::Mul(scalar.iter().cloned().chain([e]).collect())
                                }
                            })
                            .collect()
                    })
                    .collect(),
            )
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn check(gold: &str, pred: &str, expected: bool) {
        let mut budget = Budget::new(50_000_000);
        let g = parse(gold, &mut budget).unwrap_or_else(|e| panic!("gold {gold:?}: {e}"));
        let p = parse(pred, &mut budget).unwrap_or_else(|e| panic!("pred {pred:?}: {e}"));
        let outcome = equivalent(&g, &p, &Options::default(), &mut budget).unwrap();
        assert_eq!(outcome.equal, expected, "{gold:?} vs {pred:?}: {} ({g} vs {p})", outcome.reason);
    }

    #[test]
    fn matrix_product_chains_exhaust_instead_of_growing() {
        let chain = "\\begin{pmatrix}1&1\\\\1&1\\end{pmatrix}".repeat(200);
        let mut budget = Budget::new(20_000_000);
        let g = parse("1", &mut budget).unwrap();
        let p = parse(&chain, &mut budget).unwrap();
        assert!(equivalent(&g, &p, &Options::default(), &mut budget).is_err());
    }

    #[test]
    fn equivalence_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("\\frac{1}{2}", "0.5", true),
            ("\\frac{1}{3}", "0.333333", true),
            ("\\frac{1}{3}", "0.3333", false),
            ("\\frac{1}{3}", "0.33333333", true),
            ("\\frac{1}{6}", "0.1666667", true),
            ("0", "1e-30", false),
            ("\\frac{1}{3}\\cdot 10^{-10}", "0.000000", false),
            ("\\frac{1}{2004!}", "\\frac{1}{2006!}", false),
            ("4.123105625617661", "\\sqrt{17}", true),
            ("\\sqrt{17}", "4.123106", true),
            ("\\sqrt{17}", "4.1231", false),
            ("\\pi", "3.141593", true),
            ("\\pi", "3.14", false),
            // A short gold decimal is held to the same digits as a predicted one.
            ("0.3", "\\frac{1}{3}", false),
            ("3.14", "\\pi", false),
            ("0.5", "\\frac{1000}{1999}", false),
            ("0.333333", "\\frac{1}{3}", true),
            ("3.141593", "\\pi", true),
            ("2", "x=2", true),
            ("\\{1,2,3\\}", "\\{3,1,2\\}", true),
            ("1", "1, 2", false),
            ("1", "1, 1", true),
            ("(1,2)", "(2,1)", false),
            ("[0,1)", "(0,1)", false),
            ("x \\leq 5", "5 \\geq x", true),
            ("x < 5", "x \\leq 5", false),
            ("34x+45y-20z+100=0", "-34x-45y+20z-100=0", true),
            ("2x+z=1", "1", false),
            ("0<f(x)<1", "(0,1)", true),
            (
                "1\\leq|z|\\leq \\frac{3}{2}",
                "z \\in \\left[-\\frac{3}{2}, -1\\right] \\cup \\left[1, \\frac{3}{2}\\right]",
                true,
            ),
            ("\\pm 2021", "\\{-2021, 2021\\}", true),
            ("\\pm 2021", "2021", false),
            ("28\\%", "28", true),
            ("28\\%", "0.28", true),
            ("f(x)", "f(y)", false),
            ("\\sin^2 x + \\cos^2 x", "1", true),
            ("\\sin x", "\\cos x", false),
            ("k = 45, n = 2", "k = 2, n = 45", false),
            ("k = 45, n = 2", "n = 2, k = 45", true),
            // A gold with distinct names is compared name by name; other names fail.
            ("x=1, y=2", "2, 1", false),
            // Bare values answer the names in the gold's order.
            ("x=1, y=2", "1, 2", true),
            ("x=1, y=2", "(1, 2)", true),
            ("x=1, y=2", "1, 2, 3", false),
            ("x=1, y=2", "x=1, 2", false),
            ("AB=4, CD=5", "4, 5", true),
            ("AB=4, CD=5", "5, 4", false),
            ("|AB|=1", "1", true),
            ("\\frac{NO}{BO}=\\frac{1}{\\sqrt{6}}", "\\frac{\\sqrt{6}}{6}", true),
            ("x^2+y^2=1", "1", false),
            // Chains that name nothing: every member is the value.
            ("11", "5+5+1 = 11", true),
            ("11", "5+5+2 = 11", false),
            ("2", "2x = 4", false),
            ("11", "x \\approx 11", true),
            ("11", "x \\approx 11 \\approx 12", false),
            // A listed gold against the same values in parentheses, not against an interval.
            ("{1,3}", "(1,3)", true),
            ("\\{1,3\\}", "(1,3)", false),
            ("(1,3)", "\\{1,3\\}", false),
            ("x=1, y=2", "x=2, z=1", false),
            ("x=1, y=2", "a=2, b=1", false),
            ("x=1, y=2", "x=2, y=1", false),
            ("x=1, y=2", "y=2, x=1", true),
            // One family of names (`x_1, x_2`, `x` repeated) is interchangeable roots.
            ("x_1=1, x_2=2", "2, 1", true),
            ("x_1=1, x_2=2", "x_1=2, x_2=1", true),
            ("x_1=1, x_2=2", "x=2, x=1", true),
            ("x=1, x=2", "x=2, x=1", true),
            ("x_1=1, x_2=2", "a=2, b=1", false),
            ("x_1=1, x_2=2", "x_1=2, x_2=3", false),
            (
                "\\begin{pmatrix}6 & 8 \\\\ 10 & 12\\end{pmatrix}",
                "\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix} + \\begin{pmatrix}5 & 6 \\\\ 7 & 8\\end{pmatrix}",
                true,
            ),
            ("\\infty", "\\infty", true),
            ("(-\\infty, 2]", "(-\\infty, 2]", true),
            ("12:00", "12:00", true),
            ("\\text{Even}", "Even", true),
            ("\\text{odd}", "Even", false),
            // Seeded points off [0.25, 2.25) tell these from `x`.
            ("x", "|x|", false),
            ("x", "\\sqrt{x^2}", false),
            ("x", "\\max(x, 0)", false),
            ("x", "\\min(x, 3)", false),
            ("\\frac{|x|}{x}", "1", false),
            ("|x|", "\\sqrt{x^2}", true),
            ("\\ln(x^2)", "2\\ln|x|", true),
            // Every part of a union is tested, however it is written.
            // An assignment against the same equation in another form.
            ("y=2x", "2x=y", true),
            ("y=2x", "y-2x=0", true),
            ("y=2x", "2y=4x", true),
            ("y=2x", "y=3x", false),
            ("y=2x", "0=0", false),
            ("y=2x", "x=2y", false),
            ("x=2", "2=x", true),
            ("x=2", "x=3", false),
            // A chain's values must all equal the other side.
            ("1", "x = 2 = 1", false),
            ("1", "x = 1 = 2", false),
            ("1", "x = 1 \\approx 2", false),
            ("2", "x = 2 = 2", true),
            ("5", "x = 2 + 3 = 5", true),
            ("\\frac{1}{3}", "x = \\frac{1}{3} \\approx 0.33", true),
            ("x = 5", "x = 2 + 3 = 5", true),
            ("x = 5", "x = 5 = 4", false),
            ("x \\in \\{1,2\\}", "x \\in \\{2,1\\}", true),
            ("[0,1]", "[0,1] \\cup \\{3.7\\}", false),
            ("[0,\\infty)", "[0,\\infty) \\setminus \\{3.7\\}", false),
            ("\\{1,2\\}", "\\{1,2\\} \\cup [100,200]", false),
        ];
        for (gold, pred, expected) in cases {
            check(gold, pred, *expected);
        }
    }
}
