//! Exact values: rational functions whose polynomials have rational coefficients over variables,
//! π, e and square roots of integers — a canonical form, so equality is decided, not estimated.
//!
//! `√r` lives in the monomial as a square-free integer radicand: `√2·√6 = 2√3` falls out of the
//! multiplication. Two rational functions are equal when `n₁·d₂ = n₂·d₁` as polynomials, which
//! needs no polynomial gcd. Anything outside this fragment (`sin x`, `2^{1/3}`, `√x`) is
//! [`Inexact`](Why::Inexact) and left to numeric evaluation. Every big-number operation charges
//! the [`Budget`] by the size of its operands before it runs.

use std::collections::BTreeMap;

use num_bigint::BigInt;
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use crate::budget::{Budget, Exhausted, mul_cost};
use crate::parse::Expr;

/// Largest radicand kept exact: above it, square factors might hide from trial division.
const MAX_RADICAND: u64 = 1_000_000_000;
/// Units for one pair of terms multiplied (allocation and map insertion besides the arithmetic).
const PAIR_COST: u64 = 16;
/// Largest `n` of `n!` computed exactly.
const MAX_FACTORIAL: u64 = 20_000;

/// A symbol of the polynomial ring.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Atom {
    /// π
    Pi,
    /// Euler's number
    E,
    /// A variable.
    Var(String),
}

/// A monomial: atoms with positive exponents (sorted) times `√radicand`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mono {
    atoms: Vec<(Atom, u32)>,
    radicand: u64,
}

impl Mono {
    fn one() -> Self {
        Mono { atoms: Vec::new(), radicand: 1 }
    }
}

/// A polynomial with rational coefficients.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Poly {
    terms: BTreeMap<Mono, BigRational>,
}

/// A quotient of polynomials.
#[derive(Debug, Clone, PartialEq)]
pub struct RatFn {
    /// Numerator.
    pub num: Poly,
    /// Denominator, never the zero polynomial.
    pub den: Poly,
}

/// Why an expression has no exact value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Why {
    /// The work budget ran out.
    #[error(transparent)]
    Exhausted(#[from] Exhausted),
    /// Outside the exact fragment; numeric evaluation may still decide.
    #[error("no exact form: {0}")]
    Inexact(&'static str),
    /// Undefined (division by zero, `0^{-1}`).
    #[error("undefined: {0}")]
    Undefined(&'static str),
    /// Not a single value (a tuple, a set, a relation, text).
    #[error("not a number: {0}")]
    NotScalar(&'static str),
}

fn bits(q: &BigRational) -> u64 {
    q.numer().bits() + q.denom().bits()
}

/// The cost of reducing by a gcd of numbers of `a` and `b` bits: num-bigint's binary gcd takes
/// up to `a + b` steps over the longer number's words (even against 1: found by fuzzing).
fn gcd_cost(a: u64, b: u64) -> u64 {
    a.saturating_add(b).saturating_mul(a.max(b) / 64 + 1)
}

/// `a · b`, charged; integers skip the gcd reduction entirely.
pub(crate) fn rat_mul(
    a: &BigRational,
    b: &BigRational,
    budget: &mut Budget,
) -> Result<BigRational, Exhausted> {
    budget.charge(mul_cost(bits(a), bits(b)), "big-number arithmetic")?;
    if a.is_integer() && b.is_integer() {
        return Ok(BigRational::from_integer(a.numer() * b.numer()));
    }
    budget.charge(gcd_cost(bits(a), bits(b)).saturating_mul(2), "big-number arithmetic")?;
    Ok(a * b)
}

/// `a + b`, charged; equal denominators (integers among them) need no gcd.
pub(crate) fn rat_add(
    a: &BigRational,
    b: &BigRational,
    budget: &mut Budget,
) -> Result<BigRational, Exhausted> {
    budget.charge(bits(a).max(bits(b)) / 64 + 1, "big-number arithmetic")?;
    if a.denom() != b.denom() {
        budget.charge(gcd_cost(bits(a), bits(b)).saturating_mul(3), "big-number arithmetic")?;
        budget.charge(mul_cost(bits(a), bits(b)).saturating_mul(3), "big-number arithmetic")?;
    } else if !a.denom().is_one() {
        budget.charge(gcd_cost(bits(a), bits(b)), "big-number arithmetic")?;
    }
    Ok(a + b)
}

impl Poly {
    /// The constant `c`.
    pub fn constant(c: BigRational) -> Self {
        let mut terms = BTreeMap::new();
        if !c.is_zero() {
            terms.insert(Mono::one(), c);
        }
        Poly { terms }
    }

    fn atom(atom: Atom) -> Self {
        let mut terms = BTreeMap::new();
        terms.insert(Mono { atoms: vec![(atom, 1)], radicand: 1 }, BigRational::one());
        Poly { terms }
    }

    fn radical(coefficient: BigRational, radicand: u64) -> Self {
        let mut terms = BTreeMap::new();
        if !coefficient.is_zero() {
            terms.insert(Mono { atoms: Vec::new(), radicand }, coefficient);
        }
        Poly { terms }
    }

    /// Whether it is the zero polynomial.
    pub fn is_zero(&self) -> bool {
        self.terms.is_empty()
    }

    /// The rational constant it is, if it is one.
    pub fn as_rational(&self) -> Option<BigRational> {
        match self.terms.len() {
            0 => Some(BigRational::zero()),
            1 => self.terms.iter().next().filter(|(m, _)| **m == Mono::one()).map(|(_, c)| c.clone()),
            _ => None,
        }
    }

    /// Whether any variable occurs (π, e and radicals are constants).
    pub fn has_vars(&self) -> bool {
        self.terms.keys().any(|m| m.atoms.iter().any(|(a, _)| matches!(a, Atom::Var(_))))
    }

    fn add(&self, other: &Poly, budget: &mut Budget) -> Result<Poly, Exhausted> {
        let mut terms = self.terms.clone();
        for (mono, c) in &other.terms {
            let sum = match terms.get(mono) {
                Some(existing) => rat_add(existing, c, budget)?,
                None => c.clone(),
            };
            if sum.is_zero() {
                terms.remove(mono);
            } else {
                terms.insert(mono.clone(), sum);
            }
        }
        Ok(Poly { terms })
    }

    pub(crate) fn neg(&self) -> Poly {
        Poly { terms: self.terms.iter().map(|(m, c)| (m.clone(), -c)).collect() }
    }

    fn mul(&self, other: &Poly, budget: &mut Budget) -> Result<Poly, Exhausted> {
        let mut terms: BTreeMap<Mono, BigRational> = BTreeMap::new();
        for (m1, c1) in &self.terms {
            for (m2, c2) in &other.terms {
                budget
                    .charge((m1.atoms.len() + m2.atoms.len()) as u64 + PAIR_COST, "polynomial arithmetic")?;
                let (mono, factor) = mono_mul(m1, m2)?;
                let mut c = rat_mul(c1, c2, budget)?;
                if factor != 1 {
                    c = rat_mul(&c, &BigRational::from_integer(BigInt::from(factor)), budget)?;
                }
                let sum = match terms.get(&mono) {
                    Some(existing) => rat_add(existing, &c, budget)?,
                    None => c,
                };
                if sum.is_zero() {
                    terms.remove(&mono);
                } else {
                    terms.insert(mono, sum);
                }
            }
        }
        Ok(Poly { terms })
    }

    fn pow(&self, exponent: u64, budget: &mut Budget) -> Result<Poly, Exhausted> {
        // Estimate the result's size before computing: a power of a single term grows linearly in
        // bits, a sum of terms grows in term count as well.
        if exponent == 0 {
            return Ok(Poly::constant(BigRational::one()));
        }
        let size: u64 = self.terms.values().map(bits).max().unwrap_or(1).max(1);
        if let Some(q) = self.as_rational() {
            if q.is_zero() || q.abs().is_one() {
                let odd = exponent % 2 == 1;
                return Ok(Poly::constant(if q.is_negative() && !odd { q.abs() } else { q }));
            }
        }
        let estimated_bits = size.saturating_mul(exponent);
        budget.charge(mul_cost(estimated_bits, estimated_bits), "a power")?;
        // A power of a sum has at least `exponent + 1` terms, each product of them costs a
        // pair: charge that lower bound first.
        if self.terms.len() > 1 {
            let k = exponent.saturating_add(1);
            budget.charge(
                k.saturating_mul(k).saturating_mul(self.terms.len() as u64).saturating_mul(PAIR_COST),
                "a power of a sum",
            )?;
        }
        let mut result = Poly::constant(BigRational::one());
        let mut base = self.clone();
        let mut e = exponent;
        while e > 0 {
            if e & 1 == 1 {
                result = result.mul(&base, budget)?;
            }
            e >>= 1;
            if e > 0 {
                base = base.mul(&base, budget)?;
            }
        }
        Ok(result)
    }

    /// A coefficient and a monomial of it (the largest), when it is not zero.
    fn leading(&self) -> Option<(&Mono, &BigRational)> {
        self.terms.iter().next_back()
    }

    /// Whether `self = c · other` for a rational `c` with the given sign requirement.
    pub fn proportional(&self, other: &Poly, positive: bool, budget: &mut Budget) -> Result<bool, Exhausted> {
        let (Some((m1, c1)), Some((m2, c2))) = (self.leading(), other.leading()) else {
            return Ok(self.is_zero() && other.is_zero());
        };
        if m1 != m2 || self.terms.len() != other.terms.len() {
            return Ok(false);
        }
        let ratio = rat_mul(c1, &c2.recip(), budget)?;
        if positive && ratio.is_negative() {
            return Ok(false);
        }
        let scaled = other.mul(&Poly::constant(ratio), budget)?;
        Ok(scaled == *self)
    }
}

/// Multiplies monomials: returns the product and an integer factor pulled out of the radicals.
fn mono_mul(a: &Mono, b: &Mono) -> Result<(Mono, u64), Exhausted> {
    let mut atoms: Vec<(Atom, u32)> = Vec::with_capacity(a.atoms.len() + b.atoms.len());
    let (mut i, mut j) = (0, 0);
    while i < a.atoms.len() || j < b.atoms.len() {
        let pick = match (a.atoms.get(i), b.atoms.get(j)) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                let exponent = x.1.checked_add(y.1).ok_or(Exhausted { limit: 0, what: "an exponent" })?;
                i += 1;
                j += 1;
                (x.0.clone(), exponent)
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                i += 1;
                x.clone()
            }
            (Some(_), Some(y)) | (None, Some(y)) => {
                j += 1;
                y.clone()
            }
            (Some(x), None) => {
                i += 1;
                x.clone()
            }
            (None, None) => break,
        };
        atoms.push(pick);
    }
    let g = a.radicand.gcd(&b.radicand);
    let radicand = (a.radicand / g) * (b.radicand / g);
    Ok((Mono { atoms, radicand }, g))
}

impl RatFn {
    /// The constant `c`.
    pub fn constant(c: BigRational) -> Self {
        RatFn { num: Poly::constant(c), den: Poly::constant(BigRational::one()) }
    }

    fn from_poly(num: Poly) -> Self {
        RatFn { num, den: Poly::constant(BigRational::one()) }
    }

    /// The rational constant it is, if it is one.
    pub fn as_rational(&self) -> Option<BigRational> {
        let n = self.num.as_rational()?;
        let d = self.den.as_rational()?;
        (!d.is_zero()).then(|| n / d)
    }

    /// Whether any variable occurs.
    pub fn has_vars(&self) -> bool {
        self.num.has_vars() || self.den.has_vars()
    }

    fn add(&self, other: &RatFn, budget: &mut Budget) -> Result<RatFn, Exhausted> {
        if self.den == other.den {
            return Ok(RatFn { num: self.num.add(&other.num, budget)?, den: self.den.clone() });
        }
        let num = self.num.mul(&other.den, budget)?.add(&other.num.mul(&self.den, budget)?, budget)?;
        let den = self.den.mul(&other.den, budget)?;
        Ok(RatFn { num, den })
    }

    fn neg(&self) -> RatFn {
        RatFn { num: self.num.neg(), den: self.den.clone() }
    }

    fn mul(&self, other: &RatFn, budget: &mut Budget) -> Result<RatFn, Exhausted> {
        Ok(RatFn { num: self.num.mul(&other.num, budget)?, den: self.den.mul(&other.den, budget)? })
    }

    fn div(&self, other: &RatFn, budget: &mut Budget) -> Result<RatFn, Why> {
        if other.num.is_zero() {
            return Err(Why::Undefined("division by zero"));
        }
        Ok(RatFn { num: self.num.mul(&other.den, budget)?, den: self.den.mul(&other.num, budget)? })
    }

    /// `self − other` as `n / d`; equal values give the zero numerator.
    pub fn sub(&self, other: &RatFn, budget: &mut Budget) -> Result<RatFn, Exhausted> {
        self.add(&other.neg(), budget)
    }

    /// Whether the two are the same rational function.
    pub fn equals(&self, other: &RatFn, budget: &mut Budget) -> Result<bool, Exhausted> {
        let left = self.num.mul(&other.den, budget)?;
        let right = other.num.mul(&self.den, budget)?;
        Ok(left == right)
    }
}

/// The exact value of `expr`.
pub fn exact(expr: &Expr, budget: &mut Budget) -> Result<RatFn, Why> {
    budget.charge(1, "evaluating")?;
    Ok(match expr {
        Expr::Num(n) => RatFn::constant(n.value.clone()),
        Expr::Sym(name) => RatFn::from_poly(Poly::atom(Atom::Var(name.clone()))),
        Expr::Pi => RatFn::from_poly(Poly::atom(Atom::Pi)),
        Expr::E => RatFn::from_poly(Poly::atom(Atom::E)),
        Expr::Infinity => return Err(Why::Inexact("infinity")),
        Expr::Neg(a) => exact(a, budget)?.neg(),
        Expr::Add(items) => {
            let mut sum = RatFn::constant(BigRational::zero());
            for item in items {
                sum = sum.add(&exact(item, budget)?, budget)?;
            }
            sum
        }
        Expr::Mul(items) => {
            let mut product = RatFn::constant(BigRational::one());
            for item in items {
                product = product.mul(&exact(item, budget)?, budget)?;
            }
            product
        }
        Expr::Div(a, b) | Expr::Ratio(a, b) => exact(a, budget)?.div(&exact(b, budget)?, budget)?,
        Expr::Pow(base, exponent) => power(base, exponent, budget)?,
        Expr::Root(radicand, index) => root(radicand, index, budget)?,
        Expr::Factorial(n) => {
            let n = integer_constant(n, budget)?.ok_or(Why::Inexact("factorial of a non-integer"))?;
            let n = n.to_u64().ok_or(Why::Inexact("factorial of a negative or huge number"))?;
            if n > MAX_FACTORIAL {
                return Err(Why::Exhausted(Exhausted {
                    limit: MAX_FACTORIAL,
                    what: "a factorial of more than the limit",
                }));
            }
            // Σ bits(k!) ≈ n² log₂ n / 2: charge it up front.
            let log = 64 - n.max(2).leading_zeros() as u64;
            budget.charge(n.saturating_mul(n).saturating_mul(log) / 128 + 1, "a factorial")?;
            let mut f = BigInt::one();
            for k in 2..=n {
                f *= k;
            }
            RatFn::constant(BigRational::from_integer(f))
        }
        Expr::Percent(a) => {
            exact(a, budget)?.div(&RatFn::constant(BigRational::from_integer(100.into())), budget)?
        }
        Expr::Abs(a) => {
            let value = exact(a, budget)?;
            match value.as_rational() {
                Some(q) => RatFn::constant(q.abs()),
                None => return Err(Why::Inexact("absolute value of a non-rational")),
            }
        }
        Expr::Func(name, args) => function(name, args, budget)?,
        Expr::PlusMinus(..) => return Err(Why::NotScalar("a ± b is two values")),
        Expr::Text(_) => return Err(Why::NotScalar("text")),
        Expr::Bracket(..) | Expr::Set(_) | Expr::List(_) | Expr::SetOp(..) | Expr::Matrix(_) => {
            return Err(Why::NotScalar("a collection"));
        }
        Expr::Rel(..) => return Err(Why::NotScalar("a relation")),
    })
}

fn integer_constant(expr: &Expr, budget: &mut Budget) -> Result<Option<BigInt>, Why> {
    let value = exact(expr, budget)?;
    Ok(value.as_rational().filter(BigRational::is_integer).map(|q| q.to_integer()))
}

fn power(base: &Expr, exponent: &Expr, budget: &mut Budget) -> Result<RatFn, Why> {
    let exponent = exact(exponent, budget)?;
    let Some(k) = exponent.as_rational() else {
        return Err(Why::Inexact("a symbolic exponent"));
    };
    if k.is_integer() {
        let base = exact(base, budget)?;
        let magnitude =
            k.to_integer().abs().to_u64().ok_or(Exhausted { limit: 0, what: "a huge exponent" })?;
        let num = base.num.pow(magnitude, budget)?;
        let den = base.den.pow(magnitude, budget)?;
        let raised = RatFn { num, den };
        return if k.is_negative() {
            RatFn::constant(BigRational::one()).div(&raised, budget)
        } else {
            Ok(raised)
        };
    }
    if *k.denom() == BigInt::from(2) {
        // q^{m/2} = (√q)^m for a constant q ≥ 0.
        let half = Expr::Root(Box::new(base.clone()), Box::new(Expr::Num(crate::lexer::int_number(2))));
        let m = Expr::Num(crate::lexer::Number {
            value: BigRational::from_integer(k.numer().clone()),
            decimal: false,
            places: 0,
            raw: None,
        });
        return power(&half, &m, budget);
    }
    Err(Why::Inexact("a fractional exponent"))
}

fn root(radicand: &Expr, index: &Expr, budget: &mut Budget) -> Result<RatFn, Why> {
    let index = integer_constant(index, budget)?
        .and_then(|n| n.to_u32())
        .ok_or(Why::Inexact("a root of non-integer index"))?;
    let value = exact(radicand, budget)?;
    let Some(q) = value.as_rational() else {
        return Err(Why::Inexact("a root of a non-rational"));
    };
    if index < 2 {
        return Err(Why::Inexact("a root of index below 2"));
    }
    if q.is_negative() {
        return Err(Why::Inexact("a root of a negative number"));
    }
    budget.charge(mul_cost(bits(&q), bits(&q)).saturating_mul(u64::from(index)), "a root")?;
    let (n, d) = (q.numer().clone(), q.denom().clone());
    let (rn, rd) = (n.nth_root(index), d.nth_root(index));
    if num_traits::pow(rn.clone(), index as usize) == n && num_traits::pow(rd.clone(), index as usize) == d {
        return Ok(RatFn::constant(BigRational::new(rn, rd)));
    }
    if index != 2 {
        return Err(Why::Inexact("an irrational root"));
    }
    // √(n/d) = √(n·d) / d, then pull square factors out of n·d.
    let product = n * &d;
    let (outside, inside) = split_square(&product).ok_or(Why::Inexact("a radicand too large to factor"))?;
    Ok(RatFn::from_poly(Poly::radical(BigRational::new(outside, d), inside)))
}

/// `m = outside² · inside` with `inside` square-free, for `m` up to [`MAX_RADICAND`] after
/// removing the square factors found by trial division.
fn split_square(m: &BigInt) -> Option<(BigInt, u64)> {
    let mut outside = BigInt::one();
    let mut rest = m.clone();
    let mut p = 2u64;
    while p * p <= 1_000_000 {
        let pp = BigInt::from(p * p);
        while (&rest % &pp).is_zero() {
            rest /= &pp;
            outside *= p;
        }
        p += if p == 2 { 1 } else { 2 };
    }
    let r = rest.sqrt();
    if &r * &r == rest {
        return Some((outside * r, 1));
    }
    let inside = rest.to_u64().filter(|r| *r <= MAX_RADICAND)?;
    // Every prime below 1000 is out, so a square factor left would be q² with q > 1000, times
    // some other factor above 1000 (q² alone is caught above): more than 10^9.
    Some((outside, inside))
}

fn function(name: &str, args: &[Expr], budget: &mut Budget) -> Result<RatFn, Why> {
    let rationals = |budget: &mut Budget| -> Result<Option<Vec<BigRational>>, Why> {
        let mut values = Vec::new();
        for arg in args {
            match exact(arg, budget)?.as_rational() {
                Some(q) => values.push(q),
                None => return Ok(None),
            }
        }
        Ok(Some(values))
    };
    match name {
        "binom" => {
            let values = rationals(budget)?.ok_or(Why::Inexact("binomial of non-constants"))?;
            let [n, k] = values.as_slice() else { return Err(Why::Inexact("binomial arity")) };
            if !n.is_integer() || !k.is_integer() {
                return Err(Why::Inexact("binomial of non-integers"));
            }
            let (n, k) = (n.to_integer(), k.to_integer());
            if k.is_negative() || k > n {
                return Ok(RatFn::constant(BigRational::zero()));
            }
            let k =
                k.to_u64().ok_or(Why::Inexact("huge binomial"))?.min((&n - &k).to_u64().unwrap_or(u64::MAX));
            if k > MAX_FACTORIAL {
                return Err(Why::Exhausted(Exhausted { limit: MAX_FACTORIAL, what: "a binomial" }));
            }
            let mut result = BigInt::one();
            for i in 0..k {
                budget.charge(result.bits() / 64 + 1, "a binomial")?;
                result = result * (&n - i) / (i + 1);
            }
            Ok(RatFn::constant(BigRational::from_integer(result)))
        }
        "abs" | "floor" | "ceil" | "max" | "min" | "gcd" | "lcm" => {
            let values = rationals(budget)?.ok_or(Why::Inexact("a function of non-constants"))?;
            let first = values.first().cloned().ok_or(Why::Inexact("no arguments"))?;
            let value = match name {
                "abs" => first.abs(),
                "floor" => first.floor(),
                "ceil" => first.ceil(),
                "max" => values.iter().cloned().fold(first, |a, b| if b > a { b } else { a }),
                "min" => values.iter().cloned().fold(first, |a, b| if b < a { b } else { a }),
                _ => {
                    if values.iter().any(|v| !v.is_integer()) {
                        return Err(Why::Inexact("gcd of non-integers"));
                    }
                    let ints = values.iter().map(BigRational::to_integer);
                    BigRational::from_integer(if name == "gcd" {
                        ints.fold(BigInt::zero(), |a, b| a.gcd(&b))
                    } else {
                        ints.fold(BigInt::one(), |a, b| a.lcm(&b))
                    })
                }
            };
            Ok(RatFn::constant(value))
        }
        _ => Err(Why::Inexact("a function")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn value(text: &str) -> Result<RatFn, Why> {
        let mut budget = Budget::new(50_000_000);
        let expr = parse(text, &mut budget).unwrap();
        exact(&expr, &mut budget)
    }

    fn check(a: &str, b: &str, expected: bool) {
        let mut budget = Budget::new(50_000_000);
        let equal = value(a).unwrap().equals(&value(b).unwrap(), &mut budget).unwrap();
        assert_eq!(equal, expected, "{a} vs {b}");
    }

    #[test]
    fn canonical_forms_decide_equality() {
        let cases: &[(&str, &str, bool)] = &[
            ("\\frac{108 + 31\\sqrt{5}}{216}", "\\frac{1}{2}+\\frac{31\\sqrt{5}}{216}", true),
            ("\\sqrt{8}", "2\\sqrt{2}", true),
            ("\\sqrt{2}\\sqrt{6}", "2\\sqrt{3}", true),
            ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", true),
            ("\\frac{x+2}{7}", "\\frac{x}{7}+\\frac{2}{7}", true),
            ("(x+1)^2", "x^2+2x+1", true),
            ("\\frac{x^2-1}{x-1}", "x+1", true),
            ("\\frac{1}{2004!}", "\\frac{1}{2006!}", false),
            ("\\frac94\\pi", "\\frac{9\\pi}{4}", true),
            ("2^{10}", "1024", true),
            ("\\sqrt[3]{27}", "3", true),
            ("4^{1/2}", "2", true),
            ("\\binom{5}{2}", "10", true),
            ("1e-30", "0", false),
        ];
        for (a, b, expected) in cases {
            check(a, b, *expected);
        }
    }

    #[test]
    fn huge_work_exhausts_the_budget() {
        for text in ["10^{10^{10}}", "2^{2^{64}}", "100000!", "(x+1)^{100000}"] {
            assert!(matches!(value(text), Err(Why::Exhausted(_))), "{text}: {:?}", value(text).map(|_| ()));
        }
        assert!(matches!(value("\\sin x"), Err(Why::Inexact(_))));
        assert!(matches!(value("\\frac{1}{0}"), Err(Why::Undefined(_))));
    }
}
