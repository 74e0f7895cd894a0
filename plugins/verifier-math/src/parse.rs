//! A recursive-descent parser from answer tokens to [`Expr`], the syntax tree of one answer.
//!
//! Precedence, loosest first: answer lists (`,` `;` `or` `and`), relations (`=` `<` `\le` `\in`
//! ..., chained), ratios (`a:b`), set operations (`\cup` `\cap` `\setminus`), sums (`+` `-`
//! `\pm`), products (`\cdot` `\times` `/` `\div` and juxtaposition), signs, powers (right
//! associative), postfix `!` `%` `^\circ`, then atoms: numbers, symbols, `\frac`, `\sqrt`,
//! functions, brackets (groups, tuples, intervals), `\{…\}` sets, `|…|`, matrices, `\text{…}`.
//! Units after a quantity (`125 miles`, `15\mbox{ cm}^2`) are dropped.

use std::fmt;

use crate::budget::{Budget, Exhausted};
use crate::lexer::{LexError, Number, RelOp, Tok, int_number, repair_escapes, tokenize};

/// Nesting deeper than this is refused as exhausting the budget: the parser recurses, and this
/// keeps its stack well under 1 MiB even in a debug build (about 15 levels of brackets or
/// fractions, far beyond any real answer).
pub const MAX_DEPTH: u32 = 100;

/// The syntax tree of one answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A numeric literal.
    Num(Number),
    /// A variable or named constant (`x`, `x_1`, `\alpha`, `E`).
    Sym(String),
    /// π
    Pi,
    /// Euler's number.
    E,
    /// ∞
    Infinity,
    /// `-a`
    Neg(Box<Expr>),
    /// `a + b + …`
    Add(Vec<Expr>),
    /// `a · b · …`
    Mul(Vec<Expr>),
    /// `a / b`
    Div(Box<Expr>, Box<Expr>),
    /// `a ^ b`
    Pow(Box<Expr>, Box<Expr>),
    /// `\sqrt[index]{radicand}`: radicand, index.
    Root(Box<Expr>, Box<Expr>),
    /// A function applied to arguments (`sin`, `ln`, `log`, `f` of `f(x)`, `binom`).
    Func(String, Vec<Expr>),
    /// `n!`
    Factorial(Box<Expr>),
    /// `|a|`
    Abs(Box<Expr>),
    /// `a%`
    Percent(Box<Expr>),
    /// `a ± b` (`± b` is `0 ± b`).
    PlusMinus(Box<Expr>, Box<Expr>),
    /// Words that are the answer (`\text{Even}`).
    Text(String),
    /// Items in brackets, with the bracket characters: tuples and intervals.
    Bracket(char, char, Vec<Expr>),
    /// `\{a, b\}`
    Set(Vec<Expr>),
    /// Several answers (`1, 2`, `1 or 2`, `{1, 2}`).
    List(Vec<Expr>),
    /// `A \cup B`, `A \cap B`, `A \setminus B`: the operator (`∪`, `∩`, `∖`) and operands.
    SetOp(char, Vec<Expr>),
    /// A matrix, by rows.
    Matrix(Vec<Vec<Expr>>),
    /// A chain of relations: `items[0] ops[0] items[1] ops[1] …`.
    Rel(Vec<Expr>, Vec<RelOp>),
    /// `a : b`
    Ratio(Box<Expr>, Box<Expr>),
}

impl Expr {
    /// Calls `visit` on each expression directly inside this one, in order. The one place that
    /// knows which variants hold sub-expressions, so a tree walk cannot miss one.
    pub fn for_each_child<'a>(&'a self, mut visit: impl FnMut(&'a Expr)) {
        match self {
            Expr::Num(_) | Expr::Sym(_) | Expr::Pi | Expr::E | Expr::Infinity | Expr::Text(_) => {}
            Expr::Neg(a) | Expr::Factorial(a) | Expr::Abs(a) | Expr::Percent(a) => visit(a),
            Expr::Div(a, b)
            | Expr::Pow(a, b)
            | Expr::Root(a, b)
            | Expr::Ratio(a, b)
            | Expr::PlusMinus(a, b) => {
                visit(a);
                visit(b);
            }
            Expr::Add(items)
            | Expr::Mul(items)
            | Expr::Func(_, items)
            | Expr::Bracket(_, _, items)
            | Expr::Set(items)
            | Expr::List(items)
            | Expr::SetOp(_, items)
            | Expr::Rel(items, _) => items.iter().for_each(visit),
            Expr::Matrix(rows) => rows.iter().flatten().for_each(visit),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn join(f: &mut fmt::Formatter<'_>, items: &[Expr], sep: &str) -> fmt::Result {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(sep)?;
                }
                write!(f, "{item}")?;
            }
            Ok(())
        }
        match self {
            Expr::Num(n) => {
                if n.decimal {
                    write!(f, "{}~", n.value)
                } else {
                    write!(f, "{}", n.value)
                }
            }
            Expr::Sym(s) => f.write_str(s),
            Expr::Pi => f.write_str("pi"),
            Expr::E => f.write_str("e"),
            Expr::Infinity => f.write_str("oo"),
            Expr::Neg(a) => write!(f, "-({a})"),
            Expr::Add(items) => {
                f.write_str("(")?;
                join(f, items, " + ")?;
                f.write_str(")")
            }
            Expr::Mul(items) => {
                f.write_str("(")?;
                join(f, items, " * ")?;
                f.write_str(")")
            }
            Expr::Div(a, b) => write!(f, "({a})/({b})"),
            Expr::Pow(a, b) => write!(f, "({a})^({b})"),
            Expr::Root(a, n) => write!(f, "root({a}, {n})"),
            Expr::Func(name, args) => {
                write!(f, "{name}(")?;
                join(f, args, ", ")?;
                f.write_str(")")
            }
            Expr::Factorial(a) => write!(f, "({a})!"),
            Expr::Abs(a) => write!(f, "|{a}|"),
            Expr::Percent(a) => write!(f, "{a}%"),
            Expr::PlusMinus(a, b) => write!(f, "({a} ± {b})"),
            Expr::Text(t) => write!(f, "text({t:?})"),
            Expr::Bracket(open, close, items) => {
                write!(f, "{open}")?;
                join(f, items, ", ")?;
                write!(f, "{close}")
            }
            Expr::Set(items) => {
                f.write_str("{")?;
                join(f, items, ", ")?;
                f.write_str("}")
            }
            Expr::List(items) => {
                f.write_str("list[")?;
                join(f, items, "; ")?;
                f.write_str("]")
            }
            Expr::SetOp(op, items) => join(f, items, &format!(" {op} ")),
            Expr::Matrix(rows) => {
                f.write_str("matrix[")?;
                for (i, row) in rows.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    join(f, row, ", ")?;
                }
                f.write_str("]")
            }
            Expr::Rel(items, ops) => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, " {} ", ops[i - 1].symbol())?;
                    }
                    write!(f, "{item}")?;
                }
                Ok(())
            }
            Expr::Ratio(a, b) => write!(f, "{a} : {b}"),
        }
    }
}

/// Why an answer could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// The work budget ran out (also: nesting deeper than [`MAX_DEPTH`]).
    #[error(transparent)]
    Exhausted(#[from] Exhausted),
    /// Not in the answer language.
    #[error("{0}")]
    Syntax(String),
}

impl From<LexError> for ParseError {
    fn from(error: LexError) -> Self {
        match error {
            LexError::Exhausted(exhausted) => ParseError::Exhausted(exhausted),
            other => ParseError::Syntax(other.to_string()),
        }
    }
}

/// Functions written as words or commands.
const FUNCTIONS: &[&str] = &[
    "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "ln",
    "log", "lg", "exp", "max", "min", "gcd", "lcm", "det", "abs", "floor", "ceil",
];

/// Single letters read as a function when followed by `(`: `f(x)`, `P(A)`; any other letter
/// followed by `(` multiplies (`x(x+1)`).
const FUNCTION_LETTERS: &str = "fghFGHPQWpq";

/// Unit words dropped after a quantity.
const UNITS: &[&str] = &[
    "cm",
    "mm",
    "km",
    "m",
    "meter",
    "meters",
    "metre",
    "metres",
    "kg",
    "g",
    "mg",
    "gram",
    "grams",
    "s",
    "sec",
    "second",
    "seconds",
    "min",
    "minute",
    "minutes",
    "h",
    "hr",
    "hrs",
    "hour",
    "hours",
    "day",
    "days",
    "week",
    "weeks",
    "month",
    "months",
    "year",
    "years",
    "mile",
    "miles",
    "ft",
    "feet",
    "foot",
    "inch",
    "inches",
    "yd",
    "yard",
    "yards",
    "mph",
    "kmh",
    "l",
    "ml",
    "liter",
    "liters",
    "litre",
    "litres",
    "unit",
    "units",
    "dollar",
    "dollars",
    "cent",
    "cents",
    "euro",
    "euros",
    "pct",
    "percent",
    "percentage",
    "degree",
    "degrees",
    "deg",
    "rad",
    "radian",
    "radians",
    "sq",
    "square",
    "cubic",
    "people",
    "students",
    "ways",
    "times",
    "points",
    "pounds",
    "lb",
    "lbs",
    "oz",
    "ounces",
    "apples",
    "books",
    "cookies",
    "marbles",
    "items",
    "m/s",
];

/// Parses one answer.
pub fn parse(text: &str, budget: &mut Budget) -> Result<Expr, ParseError> {
    let repaired = repair_escapes(text);
    let mut toks = tokenize(&repaired, budget)?;
    split_glued_connectives(&mut toks);
    // `= 11`, `\approx 11`: the right side of a relation whose left side the text already gave.
    if toks.len() > 1 && matches!(toks[0], Tok::Rel(RelOp::Eq | RelOp::Approx)) {
        toks.remove(0);
    }
    if toks.is_empty() {
        return Err(ParseError::Syntax("empty answer".into()));
    }
    // A lone word is the answer itself (`Even`, `\text{Yes}`), not a product of letters.
    if let [Tok::Letters(word)] | [Tok::Text(word)] = toks.as_slice() {
        let word = word.trim();
        if word.chars().count() >= 2
            && word.chars().all(|c| c.is_alphabetic() || c == ' ')
            && !is_keyword(word)
        {
            return Ok(Expr::Text(normalize_text(word)));
        }
    }
    let mut parser = Parser { toks, pos: 0, depth: 0, abs_depth: 0, budget };
    let expr = parser.list(&[])?;
    if parser.pos < parser.toks.len() {
        return Err(ParseError::Syntax(format!("unexpected {:?}", parser.toks[parser.pos])));
    }
    Ok(expr)
}

/// Lowercase words separated by single spaces.
pub fn normalize_text(text: &str) -> String {
    text.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>().join(" ")
}

fn is_keyword(word: &str) -> bool {
    FUNCTIONS.contains(&word)
        || matches!(word, "pi" | "e" | "inf" | "infty" | "infinity" | "or" | "and" | "sqrt")
}

/// `1orW(x)`: a connective glued to the letters after a number or bracket.
fn split_glued_connectives(toks: &mut Vec<Tok>) {
    let mut i = 1;
    while i < toks.len() {
        if let Tok::Letters(word) = &toks[i] {
            let after_operand =
                matches!(toks[i - 1], Tok::Num(_) | Tok::RParen | Tok::RBrack | Tok::RBrace | Tok::RSet);
            for connective in ["or", "and"] {
                if after_operand && word.len() > connective.len() && word.starts_with(connective) {
                    let rest = word[connective.len()..].to_owned();
                    toks[i] = Tok::Letters(connective.to_owned());
                    toks.insert(i + 1, Tok::Letters(rest));
                    break;
                }
            }
        }
        i += 1;
    }
}

/// Whether `\text{…}` after a quantity reads as a unit (`miles`, `sq. units`, `cm/s`): short,
/// letters and unit punctuation only (no digits, commas or `=`), and none of the words that turn
/// it into a second answer, a correction or a comment (`or 6`, `(or 2)`, `is wrong, the answer
/// is 2`, `not`, `possibly`).
fn is_unit_text(text: &str) -> bool {
    const NOT_UNIT: &[&str] = &[
        "or",
        "and",
        "not",
        "no",
        "nor",
        "wrong",
        "answer",
        "answers",
        "is",
        "are",
        "was",
        "either",
        "maybe",
        "possibly",
        "perhaps",
        "probably",
        "but",
        "else",
        "instead",
        "otherwise",
        "also",
        "correct",
        "incorrect",
        "true",
        "false",
        "yes",
        "unless",
        "except",
        "if",
        "then",
        "so",
    ];
    let text = normalize_text(text);
    text.chars().any(char::is_alphabetic)
        && text.chars().count() <= 24
        && text.split(' ').count() <= 3
        && text.chars().all(|c| c.is_alphabetic() || " ./^()-²³°%$".contains(c))
        && !text.split(|c: char| !c.is_alphabetic()).any(|word| NOT_UNIT.contains(&word))
}

fn is_connective_text(text: &str) -> bool {
    matches!(normalize_text(text).as_str(), "and" | "or" | "," | ";" | "" | "or also" | "and also")
}

struct Parser<'b> {
    toks: Vec<Tok>,
    pos: usize,
    depth: u32,
    abs_depth: u32,
    budget: &'b mut Budget,
}

fn syntax<T>(message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError::Syntax(message.into()))
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_at(&self, offset: usize) -> Option<&Tok> {
        self.toks.get(self.pos + offset)
    }

    fn next(&mut self) -> Option<Tok> {
        let tok = self.toks.get(self.pos).cloned();
        self.pos += 1;
        tok
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        if self.peek() == Some(tok) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, tok: &Tok) -> Result<(), ParseError> {
        if self.eat(tok) { Ok(()) } else { syntax(format!("expected {tok:?}, found {:?}", self.peek())) }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        self.budget.charge(1, "parsing")?;
        if self.depth > MAX_DEPTH {
            return Err(ParseError::Exhausted(Exhausted {
                limit: u64::from(MAX_DEPTH),
                what: "nesting deeper than the parser allows",
            }));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn at_end(&self, terminators: &[Tok]) -> bool {
        match self.peek() {
            None => true,
            Some(tok) => terminators.contains(tok),
        }
    }

    fn is_separator(&self) -> bool {
        match self.peek() {
            Some(Tok::Op(',' | ';')) => true,
            Some(Tok::Letters(word)) => word == "or" || word == "and",
            Some(Tok::Text(text)) => is_connective_text(text),
            _ => false,
        }
    }

    /// Items separated by `,` `;` `or` `and` up to one of `terminators` (not consumed).
    fn list(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        self.enter()?;
        let mut items = Vec::new();
        loop {
            while self.is_separator() {
                self.pos += 1;
            }
            if self.at_end(terminators) {
                break;
            }
            items.push(self.relation(terminators)?);
            if !self.is_separator() && !self.at_end(terminators) {
                self.leave();
                return syntax(format!("unexpected {:?}", self.peek()));
            }
        }
        self.leave();
        match items.len() {
            0 => syntax("empty answer"),
            1 => Ok(items.pop().unwrap_or(Expr::List(Vec::new()))),
            _ => Ok(Expr::List(items)),
        }
    }

    fn relation(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        let first = self.ratio(terminators)?;
        let mut items = vec![first];
        let mut ops = Vec::new();
        while let Some(Tok::Rel(op)) = self.peek() {
            let op = *op;
            self.pos += 1;
            ops.push(op);
            items.push(self.ratio(terminators)?);
        }
        Ok(if ops.is_empty() { items.pop().unwrap_or(Expr::List(Vec::new())) } else { Expr::Rel(items, ops) })
    }

    fn ratio(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        let left = self.set_expr(terminators)?;
        if self.peek() == Some(&Tok::Op(':')) && !terminators.contains(&Tok::Op(':')) {
            self.pos += 1;
            let right = self.set_expr(terminators)?;
            return Ok(Expr::Ratio(Box::new(left), Box::new(right)));
        }
        Ok(left)
    }

    fn set_expr(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        let first = self.sum(terminators)?;
        let mut op = None;
        let mut items = vec![first];
        while let Some(Tok::Cmd(name)) = self.peek() {
            let symbol = match name.as_str() {
                "cup" => '∪',
                "cap" => '∩',
                "setminus" => '∖',
                _ => break,
            };
            if op.is_some_and(|op| op != symbol) {
                let left = Expr::SetOp(op.unwrap_or(symbol), std::mem::take(&mut items));
                items.push(left);
            }
            op = Some(symbol);
            self.pos += 1;
            items.push(self.sum(terminators)?);
        }
        Ok(match op {
            Some(op) => Expr::SetOp(op, items),
            None => items.pop().unwrap_or(Expr::List(Vec::new())),
        })
    }

    fn sum(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        self.enter()?;
        let mut terms = vec![self.signed(terminators)?];
        loop {
            match self.peek() {
                Some(Tok::Op('+')) => {
                    self.pos += 1;
                    terms.push(self.signed(terminators)?);
                }
                Some(Tok::Op('-')) => {
                    self.pos += 1;
                    let term = self.signed(terminators)?;
                    terms.push(Expr::Neg(Box::new(term)));
                }
                Some(Tok::Cmd(name)) if name == "pm" || name == "mp" => {
                    self.pos += 1;
                    let term = self.signed(terminators)?;
                    let left = if terms.len() == 1 {
                        terms.pop().unwrap_or(Expr::List(Vec::new()))
                    } else {
                        Expr::Add(std::mem::take(&mut terms))
                    };
                    terms = vec![Expr::PlusMinus(Box::new(left), Box::new(term))];
                }
                _ => break,
            }
        }
        self.leave();
        Ok(if terms.len() == 1 { terms.pop().unwrap_or(Expr::List(Vec::new())) } else { Expr::Add(terms) })
    }

    fn signed(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        self.enter()?;
        let result = match self.peek() {
            Some(Tok::Op('-')) => {
                self.pos += 1;
                self.signed(terminators).map(|e| Expr::Neg(Box::new(e)))
            }
            Some(Tok::Op('+')) => {
                self.pos += 1;
                self.signed(terminators)
            }
            Some(Tok::Cmd(name)) if name == "pm" || name == "mp" => {
                self.pos += 1;
                self.signed(terminators)
                    .map(|e| Expr::PlusMinus(Box::new(Expr::Num(int_number(0))), Box::new(e)))
            }
            _ => self.product(terminators),
        };
        self.leave();
        result
    }

    /// Whether the next token can start an operand multiplied by juxtaposition.
    fn starts_operand(&self, terminators: &[Tok]) -> bool {
        if self.at_end(terminators) {
            return false;
        }
        match self.peek() {
            Some(Tok::Num(_) | Tok::LParen | Tok::LBrace) => true,
            Some(Tok::Letters(word)) => word != "or" && word != "and",
            Some(Tok::Cmd(name)) => !matches!(
                name.as_str(),
                "cdot"
                    | "times"
                    | "div"
                    | "pm"
                    | "mp"
                    | "cup"
                    | "cap"
                    | "setminus"
                    | "end"
                    | "to"
                    | "rightarrow"
                    | "implies"
                    | "iff"
                    | "rfloor"
                    | "rceil"
                    | "rangle"
                    | "dots"
                    | "ldots"
                    | "cdots"
                    | "land"
                    | "lor"
                    | "wedge"
                    | "vee"
                    | "neg"
                    | "not"
            ),
            Some(Tok::Op('|')) => self.abs_depth == 0,
            _ => false,
        }
    }

    fn product(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        self.enter()?;
        let mut factors = vec![self.power(terminators)?];
        loop {
            let op = match self.peek() {
                Some(Tok::Op('*')) => Some('*'),
                Some(Tok::Cmd(name)) if name == "cdot" || name == "times" => Some('*'),
                Some(Tok::Op('/')) => Some('/'),
                Some(Tok::Cmd(name)) if name == "div" => Some('/'),
                _ => None,
            };
            match op {
                Some('*') => {
                    self.pos += 1;
                    factors.push(self.power(terminators)?);
                }
                Some(_) => {
                    self.pos += 1;
                    let denominator = self.power(terminators)?;
                    let numerator = collapse_mul(std::mem::take(&mut factors));
                    factors.push(Expr::Div(Box::new(numerator), Box::new(denominator)));
                }
                None if self.skip_unit(&factors) => {}
                None if self.starts_operand(terminators) => factors.push(self.power(terminators)?),
                None => break,
            }
        }
        self.leave();
        Ok(collapse_mul(factors))
    }

    /// Skips a unit word (and its power) after a quantity; whether one was skipped. Text is a
    /// unit only when it looks like one (see [`is_unit_text`]) and follows a quantity, never a
    /// word or letter answer (`\text{Yes} \text{No}`, `A \text{ B}`); other text after a value
    /// is left unparsed, so the answer fails to parse (`5 \text{ or 6}` is no answer `5`).
    fn skip_unit(&mut self, factors: &[Expr]) -> bool {
        let after_word = factors.iter().all(|f| matches!(f, Expr::Text(_) | Expr::Sym(_)));
        let is_unit = match self.peek() {
            Some(Tok::Letters(word)) => {
                UNITS.contains(&word.as_str())
                    && !matches!(self.peek_at(1), Some(Tok::LParen | Tok::Op('_')))
                    && (word.len() > 1 || !matches!(self.peek_at(1), Some(Tok::Num(_) | Tok::Letters(_))))
            }
            Some(Tok::Text(text)) => !after_word && is_unit_text(text),
            _ => false,
        };
        if !is_unit {
            return false;
        }
        self.pos += 1;
        if self.peek() == Some(&Tok::Op('^')) && matches!(self.peek_at(1), Some(Tok::Num(_))) {
            self.pos += 2;
        }
        true
    }

    fn power(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        self.enter()?;
        let base = self.postfix(terminators)?;
        let result = if self.peek() == Some(&Tok::Op('^')) && !matches!(self.peek_at(1), Some(Tok::Degree)) {
            self.pos += 1;
            if self.peek() == Some(&Tok::LBrace)
                && self.peek_at(1) == Some(&Tok::Degree)
                && self.peek_at(2) == Some(&Tok::RBrace)
            {
                self.pos += 3;
                Ok(base)
            } else {
                let exponent = self.exponent(terminators)?;
                let mut expr = Expr::Pow(Box::new(base), Box::new(exponent));
                expr = self.postfix_ops(expr)?;
                Ok(expr)
            }
        } else {
            Ok(base)
        };
        self.leave();
        result
    }

    fn exponent(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        self.enter()?;
        let result = self.exponent_inner(terminators);
        self.leave();
        result
    }

    fn exponent_inner(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        match self.peek() {
            Some(Tok::Op('-')) => {
                self.pos += 1;
                Ok(Expr::Neg(Box::new(self.exponent(terminators)?)))
            }
            Some(Tok::Op('+')) => {
                self.pos += 1;
                self.exponent(terminators)
            }
            _ => self.power(terminators),
        }
    }

    fn postfix(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        let atom = self.atom(terminators)?;
        self.postfix_ops(atom)
    }

    fn postfix_ops(&mut self, mut expr: Expr) -> Result<Expr, ParseError> {
        loop {
            match self.peek() {
                Some(Tok::Op('!')) => {
                    self.pos += 1;
                    expr = Expr::Factorial(Box::new(expr));
                }
                Some(Tok::Op('%')) => {
                    self.pos += 1;
                    expr = Expr::Percent(Box::new(expr));
                }
                Some(Tok::Degree) => self.pos += 1,
                Some(Tok::Op('^')) if self.peek_at(1) == Some(&Tok::Degree) => self.pos += 2,
                _ => return Ok(expr),
            }
        }
    }

    /// A LaTeX macro argument: a brace group, or a single token (one digit of a number).
    fn argument(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let result = match self.peek().cloned() {
            Some(Tok::LBrace) => {
                self.pos += 1;
                let inner = self.list(&[Tok::RBrace])?;
                self.expect(&Tok::RBrace)?;
                Ok(inner)
            }
            Some(Tok::Num(number)) => match number.raw.as_deref() {
                Some(raw) if raw.len() > 1 => {
                    let (first, rest) = raw.split_at(1);
                    let first_value: i64 = first.parse().unwrap_or(0);
                    let rest_value = rest.parse::<num_bigint::BigInt>().unwrap_or_default();
                    self.toks[self.pos] = Tok::Num(Number {
                        value: num_rational::BigRational::from_integer(rest_value),
                        decimal: false,
                        places: 0,
                        raw: Some(rest.to_owned()),
                    });
                    Ok(Expr::Num(int_number(first_value)))
                }
                _ => {
                    self.pos += 1;
                    Ok(Expr::Num(number))
                }
            },
            Some(Tok::Letters(word)) if word.len() > 1 => {
                let mut chars = word.chars();
                let first = chars.next().map(String::from).unwrap_or_default();
                self.toks[self.pos] = Tok::Letters(chars.collect());
                Ok(symbol(&first))
            }
            Some(_) => self.atom(&[]),
            None => syntax("missing argument"),
        };
        self.leave();
        result
    }

    fn atom(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        self.enter()?;
        let result = self.atom_inner(terminators);
        self.leave();
        result
    }

    fn atom_inner(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        let Some(tok) = self.next() else {
            return syntax("unexpected end");
        };
        match tok {
            Tok::Num(number) => {
                // `204_5`: a numeral in base 5.
                if self.peek() == Some(&Tok::Op('_')) {
                    self.pos += 1;
                    let base = self.argument()?;
                    return Ok(based_numeral(&number, &base)
                        .unwrap_or_else(|| Expr::Func("base".into(), vec![Expr::Num(number), base])));
                }
                Ok(Expr::Num(number))
            }
            Tok::Letters(word) => self.word(word, terminators),
            Tok::Text(text) => {
                // Short text may be math (`\text{E}`, `\text{(C)}`); longer text is words.
                let trimmed = text.trim();
                if trimmed.chars().count() <= 12 {
                    match parse(trimmed, self.budget) {
                        Ok(expr) => return Ok(expr),
                        Err(ParseError::Exhausted(e)) => return Err(ParseError::Exhausted(e)),
                        Err(ParseError::Syntax(_)) => {}
                    }
                }
                Ok(Expr::Text(normalize_text(trimmed)))
            }
            Tok::LParen => self.bracketed('(', terminators),
            Tok::LBrack => self.bracketed('[', terminators),
            Tok::LBrace => {
                let inner = self.list(&[Tok::RBrace])?;
                self.expect(&Tok::RBrace)?;
                Ok(inner)
            }
            Tok::LSet => {
                if self.eat(&Tok::RSet) {
                    return Ok(Expr::Set(Vec::new()));
                }
                let inner = self.list(&[Tok::RSet])?;
                self.expect(&Tok::RSet)?;
                Ok(Expr::Set(match inner {
                    Expr::List(items) => items,
                    one => vec![one],
                }))
            }
            Tok::Op('|') if self.abs_depth == 0 || !matches!(self.peek(), Some(Tok::Op('|'))) => {
                self.abs_depth += 1;
                let inner = self.sum(&[Tok::Op('|')]);
                self.abs_depth -= 1;
                let inner = inner?;
                self.expect(&Tok::Op('|'))?;
                Ok(Expr::Abs(Box::new(inner)))
            }
            Tok::Cmd(name) => self.command(name, terminators),
            other => syntax(format!("unexpected {other:?}")),
        }
    }

    fn bracketed(&mut self, open: char, _terminators: &[Tok]) -> Result<Expr, ParseError> {
        let closers = [Tok::RParen, Tok::RBrack];
        let inner = self.list(&closers)?;
        let close = match self.next() {
            Some(Tok::RParen) => ')',
            Some(Tok::RBrack) => ']',
            other => return syntax(format!("expected a closing bracket, found {other:?}")),
        };
        Ok(match inner {
            Expr::List(items) => Expr::Bracket(open, close, items),
            one if open == '(' && close == ')' || open == '[' && close == ']' => one,
            one => Expr::Bracket(open, close, vec![one]),
        })
    }

    fn word(&mut self, word: String, terminators: &[Tok]) -> Result<Expr, ParseError> {
        match word.as_str() {
            "pi" => return Ok(Expr::Pi),
            "inf" | "infty" | "infinity" | "oo" => return Ok(Expr::Infinity),
            "sqrt" => {
                let radicand = self.function_argument(terminators)?;
                return Ok(Expr::Root(Box::new(radicand), Box::new(Expr::Num(int_number(2)))));
            }
            _ => {}
        }
        if FUNCTIONS.contains(&word.as_str()) {
            return self.function(word, terminators);
        }
        if let Some(prefix) =
            FUNCTIONS.iter().filter(|f| word.starts_with(**f) && f.len() >= 2).max_by_key(|f| f.len())
        {
            // `sinx`: a function name glued to its argument.
            let rest = word[prefix.len()..].to_owned();
            self.pos -= 1;
            self.toks[self.pos] = Tok::Letters(rest);
            self.toks.insert(self.pos, Tok::Letters((*prefix).to_owned()));
            self.pos += 1;
            return self.function((*prefix).to_owned(), terminators);
        }
        let mut letters = word.chars();
        let first = letters.next().map(String::from).unwrap_or_default();
        let rest: String = letters.collect();
        if !rest.is_empty() {
            // Juxtaposed letters multiply: leave the rest for the product loop.
            self.pos -= 1;
            self.toks[self.pos] = Tok::Letters(rest.clone());
            self.toks.insert(self.pos, Tok::Letters(first.clone()));
            self.pos += 1;
        }
        let mut name = first;
        if !rest.is_empty() {
            return Ok(symbol(&name));
        }
        // Subscripts and primes are part of the name: `x_1`, `a_{n+1}`, `f'`.
        loop {
            if self.peek() == Some(&Tok::Op('_')) {
                self.pos += 1;
                let sub = self.argument()?;
                name = format!("{name}_{{{sub}}}");
            } else if self.peek() == Some(&Tok::Op('\'')) {
                self.pos += 1;
                name.push('\'');
            } else {
                break;
            }
        }
        if self.peek() == Some(&Tok::LParen)
            && (FUNCTION_LETTERS.contains(name.as_str()) || name.contains('_') || name.ends_with('\''))
        {
            self.pos += 1;
            let args = self.list(&[Tok::RParen])?;
            self.expect(&Tok::RParen)?;
            let args = match args {
                Expr::List(items) => items,
                one => vec![one],
            };
            return Ok(Expr::Func(name, args));
        }
        Ok(symbol(&name))
    }

    /// The argument of `sin`, `ln`, `sqrt` written as words or commands: a bracket group, a brace
    /// group, or the juxtaposed product that follows (`\sin 2x`).
    fn function_argument(&mut self, terminators: &[Tok]) -> Result<Expr, ParseError> {
        match self.peek() {
            Some(Tok::LParen | Tok::LBrace | Tok::LBrack) => self.postfix(terminators),
            _ => {
                let mut factors = vec![self.power(terminators)?];
                while self.starts_operand(terminators)
                    && !matches!(self.peek(), Some(Tok::Letters(w)) if FUNCTIONS.contains(&w.as_str()))
                {
                    factors.push(self.power(terminators)?);
                }
                Ok(collapse_mul(factors))
            }
        }
    }

    fn function(&mut self, name: String, terminators: &[Tok]) -> Result<Expr, ParseError> {
        let mut base = None;
        if name == "log" && self.eat(&Tok::Op('_')) {
            base = Some(self.argument()?);
        }
        let mut power = None;
        if self.peek() == Some(&Tok::Op('^')) {
            self.pos += 1;
            power = Some(self.exponent(terminators)?);
        }
        let argument = self.function_argument(terminators)?;
        let args = match argument {
            Expr::Bracket('(', ')', items) => items,
            Expr::List(items) => items,
            one => vec![one],
        };
        let mut expr = match base {
            Some(base) => Expr::Func("log".into(), args.into_iter().chain(std::iter::once(base)).collect()),
            None => Expr::Func(name, args),
        };
        if let Some(power) = power {
            expr = Expr::Pow(Box::new(expr), Box::new(power));
        }
        Ok(expr)
    }

    fn command(&mut self, name: String, terminators: &[Tok]) -> Result<Expr, ParseError> {
        match name.as_str() {
            "frac" => {
                let numerator = self.argument()?;
                let denominator = self.argument()?;
                Ok(Expr::Div(Box::new(numerator), Box::new(denominator)))
            }
            "binom" => {
                let n = self.argument()?;
                let k = self.argument()?;
                Ok(Expr::Func("binom".into(), vec![n, k]))
            }
            "sqrt" => {
                let index = if self.eat(&Tok::LBrack) {
                    let index = self.list(&[Tok::RBrack])?;
                    self.expect(&Tok::RBrack)?;
                    index
                } else {
                    Expr::Num(int_number(2))
                };
                let radicand = self.argument()?;
                Ok(Expr::Root(Box::new(radicand), Box::new(index)))
            }
            "pi" => Ok(Expr::Pi),
            "infty" => Ok(Expr::Infinity),
            "emptyset" => Ok(Expr::Set(Vec::new())),
            "boxed" | "fbox" => self.argument(),
            "lfloor" | "lceil" => {
                let closer = if name == "lfloor" { "rfloor" } else { "rceil" };
                let inner = self.sum(&[Tok::Cmd(closer.into())])?;
                self.expect(&Tok::Cmd(closer.into()))?;
                Ok(Expr::Func(if name == "lfloor" { "floor" } else { "ceil" }.into(), vec![inner]))
            }
            "langle" => {
                let inner = self.list(&[Tok::Cmd("rangle".into())])?;
                self.expect(&Tok::Cmd("rangle".into()))?;
                Ok(Expr::Bracket(
                    '(',
                    ')',
                    match inner {
                        Expr::List(items) => items,
                        one => vec![one],
                    },
                ))
            }
            "begin" => self.environment(),
            "exp" | "ln" | "log" | "lg" | "sin" | "cos" | "tan" | "sec" | "csc" | "cot" | "arcsin"
            | "arccos" | "arctan" | "sinh" | "cosh" | "tanh" | "max" | "min" | "gcd" | "lcm" | "det" => {
                self.function(name, terminators)
            }
            "sum" | "prod" | "int" | "lim" | "to" | "rightarrow" | "implies" | "iff" | "dots" | "ldots"
            | "cdots" | "land" | "lor" | "wedge" | "vee" | "neg" | "not" | "end" | "rangle" | "rfloor"
            | "rceil" | "cdot" | "times" | "div" | "cup" | "cap" | "setminus" | "pm" | "mp" => {
                syntax(format!("\\{name} is not supported here"))
            }
            _ => {
                // Greek letters and other symbols.
                let mut name = name;
                while self.peek() == Some(&Tok::Op('_')) {
                    self.pos += 1;
                    let sub = self.argument()?;
                    name = format!("{name}_{{{sub}}}");
                }
                Ok(Expr::Sym(format!("\\{name}")))
            }
        }
    }

    fn environment(&mut self) -> Result<Expr, ParseError> {
        self.expect(&Tok::LBrace)?;
        let mut env = String::new();
        while let Some(tok) = self.next() {
            match tok {
                Tok::RBrace => break,
                Tok::Letters(word) => env.push_str(&word),
                Tok::Op('*') => env.push('*'),
                other => return syntax(format!("bad environment name near {other:?}")),
            }
        }
        if env == "array" && self.peek() == Some(&Tok::LBrace) {
            // Column spec `{cc|c}`.
            while let Some(tok) = self.next() {
                if tok == Tok::RBrace {
                    break;
                }
            }
        }
        let end = Tok::Cmd("end".into());
        let mut rows = Vec::new();
        let mut row = Vec::new();
        loop {
            if self.at_end(std::slice::from_ref(&end)) {
                break;
            }
            if self.eat(&Tok::RowSep) {
                rows.push(std::mem::take(&mut row));
                continue;
            }
            if self.eat(&Tok::Op('&')) {
                continue;
            }
            row.push(self.relation(&[Tok::Op('&'), Tok::RowSep, end.clone()])?);
        }
        if !row.is_empty() {
            rows.push(row);
        }
        rows.retain(|row| !row.is_empty());
        self.expect(&end)?;
        self.expect(&Tok::LBrace)?;
        while let Some(tok) = self.next() {
            if tok == Tok::RBrace {
                break;
            }
        }
        match env.as_str() {
            "pmatrix" | "bmatrix" | "Bmatrix" | "matrix" | "smallmatrix" | "array" | "vmatrix" => {
                let width = rows.first().map_or(0, Vec::len);
                if rows.is_empty() || rows.iter().any(|row| row.len() != width) {
                    return syntax("matrix rows of different lengths");
                }
                let matrix = Expr::Matrix(rows);
                Ok(if env == "vmatrix" { Expr::Func("det".into(), vec![matrix]) } else { matrix })
            }
            _ => {
                let items: Vec<Expr> = rows.into_iter().flatten().collect();
                match items.len() {
                    0 => syntax("empty environment"),
                    1 => Ok(items.into_iter().next().unwrap_or(Expr::List(Vec::new()))),
                    _ => Ok(Expr::List(items)),
                }
            }
        }
    }
}

fn symbol(name: &str) -> Expr {
    match name {
        "e" => Expr::E,
        _ => Expr::Sym(name.to_owned()),
    }
}

fn collapse_mul(mut factors: Vec<Expr>) -> Expr {
    if factors.len() == 1 { factors.pop().unwrap_or(Expr::List(Vec::new())) } else { Expr::Mul(factors) }
}

/// `digits_base` as its value, when every digit is below the base (2 to 36).
fn based_numeral(number: &Number, base: &Expr) -> Option<Expr> {
    let raw = number.raw.as_deref()?;
    let Expr::Num(base) = base else { return None };
    let base: u32 = base.value.to_integer().try_into().ok()?;
    if !(2..=36).contains(&base) || raw.len() > 1000 {
        return None;
    }
    let value = num_bigint::BigInt::parse_bytes(raw.as_bytes(), base)?;
    Some(Expr::Num(Number {
        value: num_rational::BigRational::from_integer(value),
        decimal: false,
        places: 0,
        raw: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &str) {
        let mut budget = Budget::new(1_000_000);
        let got = match parse(input, &mut budget) {
            Ok(expr) => expr.to_string(),
            Err(error) => format!("error: {error}"),
        };
        assert_eq!(got, expected, "input: {input:?}");
    }

    #[test]
    fn parses_the_answer_language() {
        let cases: &[(&str, &str)] = &[
            ("\\frac{1}{2}", "(1)/(2)"),
            ("\\frac94\\pi", "((9)/(4) * pi)"),
            ("\\dfrac{108 + 31\\sqrt{5}}{216}", "((108 + (31 * root(5, 2))))/(216)"),
            ("\\sqrt 2+\\sqrt 5", "(root(2, 2) + root(5, 2))"),
            ("2x^2-3", "((2 * (x)^(2)) + -(3))"),
            ("x \\leq 5", "x <= 5"),
            ("(1,4.5)", "(1, 9/2~)"),
            ("[0,1)", "[0, 1)"),
            ("\\{-1\\} \\cup [0,7)", "{-(1)} ∪ [0, 7)"),
            ("28\\%", "28%"),
            ("90^\\circ", "90"),
            ("125\\text{ miles}", "125"),
            ("15\\mbox{ cm}^2", "15"),
            ("\\text{Even}", "text(\"even\")"),
            ("Even", "text(\"even\")"),
            ("E", "E"),
            ("W(x)=1orW(x)=-1", "list[W(x) = 1; W(x) = -(1)]"),
            ("6 \\text{ and } 8", "list[6; 8]"),
            ("3 \\pm 2 \\sqrt{2}", "(3 ± (2 * root(2, 2)))"),
            ("\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}", "matrix[1, 0; 0, 1]"),
            ("204_5", "54"),
            ("x_{1}=\\frac{1}{2},\\quadx_{2}=1", "list[x_{1} = (1)/(2); x_{2} = 1]"),
            ("S_{MBCN}:S=7:32", "S_{(M * B * C * N)} : S = 7 : 32"),
            ("|z|", "|z|"),
            ("1\\leq|z|\\leq \\frac{3}{2}", "1 <= |z| <= (3)/(2)"),
            ("f(2) < f(1)", "f(2) < f(1)"),
            ("x(x+1)", "(x * (x + 1))"),
            ("\\sin^2 x + \\cos^2 x", "((sin(x))^(2) + (cos(x))^(2))"),
            ("10^{10^{10}}", "(10)^((10)^(10))"),
            ("{35 cm,4}", "list[35; 4]"),
            ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, (pi)/(2))"),
            ("{(", "error: empty answer"),
        ];
        for (input, expected) in cases {
            check(input, expected);
        }
    }

    #[test]
    fn deep_nesting_exhausts_instead_of_overflowing() {
        let deep = "(".repeat(100_000) + "1" + &")".repeat(100_000);
        let mut budget = Budget::new(10_000_000);
        assert!(matches!(parse(&deep, &mut budget), Err(ParseError::Exhausted(_))));
    }
}
